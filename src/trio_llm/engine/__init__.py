"""The engine: continuous batching over a paged KV cache, on transformers models.

Read in this order: `sequence` (a request's tokens and progress), `block_manager` (KV blocks,
prefix cache), `scheduler` (who runs this step, chunked prefill, preemption), `model_runner`
(packed inputs, the forward pass, with the `attention` package for the paged attention, one
module per backend, `weight_sets` for the single-token steps' lower-precision weights, and
`sampler` for the next tokens), `core` (EngineCore: requests in, one EngineCoreOutputs per step
out), `process` (the engine process around EngineCore, on the shared-memory rings; it reads an
`EngineLaunch`, ipc/messages.py, first), and `loader` (a resolved model's config, dtype, device
and weights: the torch half; the name-to-directory half is trio_llm/model_files.py).

What the frontend and the engine both use lives outside this package, where both may import
it: `trio_llm.grammar` (constraints in llguidance's terms), `trio_llm.model_files` (model names
to directories, tokenizer, generation config), `trio_llm.ipc.messages` (the wire messages).
This package imports nothing itself.
"""
