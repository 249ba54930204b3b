"""The generation core: what one engine step does, and the loop around it.

Read in this order: `sequence` (a request's tokens and progress), `block_manager` (KV blocks,
the prefix cache), `scheduler` (who runs this step: chunked prefill, priorities, preemption),
`input_batch` (the step's packed inputs, kept between steps), `model_runner` (the forward over
them, with `cuda_graphs` for decode steps on a GPU, and `sampler` for the next tokens),
`structured` (grammars per step), `speculative` (n-gram drafts), `token_bans`, `kv_events`,
`pooling_runner` (the step of an embedding or scoring model), `build` (the parts an engine is
assembled from at start-up) and `core` (EngineCore: requests in, one EngineCoreOutputs per step
out)."""
