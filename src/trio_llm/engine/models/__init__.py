"""What computes a model's outputs from its weights: loading them (`loader`), the choice between
the engine's own forward and transformers' modules (`forwards`), the own Llama-family forward
(`llama`), the generic path for any causal LM (`generic`, with `attention_layers` finding what
each layer asks of attention), quantized weights in the own forward (`quantized`,
`gguf_weights`), the single-token steps' lower-precision weights (`weight_sets`), and the heads
of embedding and scoring models (`pooling`, `classifier`).

Nothing here knows of requests or steps (engine/step/ does)."""
