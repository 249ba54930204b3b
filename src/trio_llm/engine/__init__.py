"""The engine: continuous batching over a paged KV cache, on transformers models.

Read in this order: `sequence` (a request's tokens and progress), `block_manager` (KV blocks,
prefix cache), `scheduler` (who runs this step, chunked prefill, preemption), `model_runner`
(packed inputs, the forward pass, with the `attention` package for the paged attention, one
module per backend, `weight_sets` for the single-token steps' lower-precision weights, and
`sampler` for the next tokens), `core` (EngineCore: requests in, one EngineCoreOutputs per step
out), `process` (the engine process around EngineCore, on the shared-memory rings; `launch` is
what it reads first), and `loader` (model names to weights on disk).

This package imports nothing itself, so the frontend can import `trio_llm.engine.launch`
without torch.
"""
