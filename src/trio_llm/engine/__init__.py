"""The engine: continuous batching over a paged KV cache, on transformers models, in a process
of its own.

Where to look, lower layers first (a module imports only from layers below its own):
- `hf`, `ops/`: what the engine reads off transformers' objects (text config, decoder stack),
  and compute shaped so that a row's result does not depend on its call (the matmul, rowwise
  elementwise functions, MKL's reproducible mode).
- `attention/`: the paged attention, one module per backend (torch on the CPU, the Triton
  kernels on a GPU, packed attention for pooling models), behind one metadata interface.
- `quant/`: quantized weight formats and their kernels; `lora/`: adapters, their slots and the
  grouped update a step adds.
- `plans/`: per-machine choices made at start-up: the dtype, batch invariance.
- `models/`: what computes outputs from weights: loading, the own Llama-family forward, the
  generic path for any causal LM, quantized weights in the own forward, pooling and classifier
  heads.
- `step/`: one engine step and the loop around it: sequences, blocks, the scheduler, the model
  runner, the sampler, grammars, drafts; `build` assembles an engine, `core` is EngineCore
  (requests in, one EngineCoreOutputs per step out).
- `speech/`: the speech-to-text engine (Whisper on CTranslate2), a kind of its own.
- `process` (the engine process around EngineCore on the shared-memory rings; it reads an
  `EngineLaunch`, ipc/messages.py, first) and `perplexity` (a model's perplexity through
  EngineCore, for the quantization reports).

What the frontend and the engine both use lives outside this package, where both may import
it: `trio_llm.grammar` (constraints in llguidance's terms), `trio_llm.model_files` (model names
to directories, tokenizer, generation config), `trio_llm.ipc.messages` (the wire messages).
This package imports nothing itself.
"""
