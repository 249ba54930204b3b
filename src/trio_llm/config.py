"""EngineArgs: how to start an engine. One flat, typed record shared by the CLI, `open_engine`
and the engine process (it crosses to the engine as msgpack on the command line's stdin)."""

from __future__ import annotations

import re

import msgspec

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"

CPU_KV_CACHE_BYTES = 1 << 30

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """'2GiB', '512M', '1.5G' or a plain byte count -> bytes (binary units)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r} as a size; use e.g. 2GiB, 512MiB or 1073741824")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


class EngineArgs(msgspec.Struct, kw_only=True, omit_defaults=True):
    model: str = DEFAULT_MODEL
    """A name the loader resolves: the default model, a local HF directory, a .gguf file, or a
    hub id already in the local cache."""
    served_model_name: str | None = None
    task: str = "auto"
    """auto | generate | embed | transcribe: auto serves embeddings from an encoder (BERT
    family), generation from a decoder and speech-to-text from a Whisper model (CTranslate2
    format); embed makes a decoder serve embeddings (last-token pooling)."""
    dtype: str = "auto"
    """auto | float32 | bfloat16 | float16"""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N"""
    single_token_dtype: str = "none"
    """none | float16 | bfloat16: steps that compute a single token (one stream decoding
    alone) run the linear layers on a copy of the weights in this dtype. On a CPU such a step
    streams every weight from memory, so fp16 copies make it ~1.6x faster; the price is the
    memory of the copies and outputs that differ slightly between a stream alone and the same
    stream batched with others."""
    max_model_len: int | None = None
    """Defaults to the model's own context length."""
    max_num_seqs: int = 128
    max_num_batched_tokens: int | None = None
    """Token budget of one step: decodes first, then prefill chunks fill the rest. None: the
    device's default (`DEVICE_DEFAULTS`)."""
    max_num_pooled_tokens: int = 8192
    """A pooling (embedding) engine's token budget of one step, and so its limit on inputs per
    step: no decode waits on its steps, and fewer, larger steps cost less per input."""
    block_size: int = 16
    kv_cache_memory: str | int = "auto"
    """A size (e.g. 2GiB), or auto: the device's default (`DEVICE_DEFAULTS`): a fixed size on a
    CPU, `kv_cache_fraction` of the memory left free after loading the weights on a GPU."""
    kv_cache_fraction: float = 0.8
    """The share of a GPU's free memory an auto KV cache takes; the rest is for activations,
    the CUDA graphs' pool and the allocator's slack."""
    enable_prefix_caching: bool = True
    quantization: str = "auto"
    """auto | none | int8 | int4 | w8a8: how the weights run (engine/quant). auto: a quantized
    GGUF file in its own formats (Q4_0, Q4_1, Q4_K as int4 groups, Q8_0 as two int4 planes,
    other formats as int8 rows; the activations in bfloat16 unless `dtype` says otherwise),
    anything else in its float dtype;
    none: a GGUF dequantized to `dtype`; int8 / int4: a float checkpoint quantized at load;
    w8a8: int8 weights and int8 activations. Quantized weights run on a CPU, with the own
    forward."""
    scheduling_policy: str = "fcfs"
    """fcfs | priority (vLLM's --scheduling-policy): with fcfs requests run in arrival order and
    a request's `priority` must be 0; with priority a lower value runs first (and is preempted
    last), FCFS among equals."""
    kv_events_endpoint: str | None = None
    """A ZeroMQ endpoint (e.g. tcp://*:5557) on which the engine publishes its KV-cache events
    in vLLM's format, for a KV-aware router (engine/step/kv_events.py); None: none are published."""
    kv_events_topic: str = ""
    data_parallel_rank: int | None = None
    """This engine's replica index among its model's (stamped on its KV events); None: the
    model has one replica."""
    model_impl: str = "auto"
    """auto | own | transformers: the engine's own forward where one covers the model (the
    Llama family: Llama, Qwen2, Mistral), transformers' modules with the paged attention for any
    other causal LM (engine/models/forwards.py); own refuses a model no own forward covers."""
    batch_invariant: str = "auto"
    """auto | on | off: compute every row of a step one way whatever else the step holds, so a
    request gets the same tokens alone or in company, however its prompt is chunked, after a
    preemption or from the prefix cache (engine/plans/invariance.py). auto: on where this CPU
    class's matmul plan passes its start-up check (every class measured so far), off with quantized
    weights (their prefill chunks would stay on the slower quantized kernels); on: also padded
    matmuls where only those pass, quantized weights on their kernels for every row, and
    refused at start-up where it cannot be kept (CUDA, the Triton backend, single-token weight
    sets, matmuls outside nn.Linear such as a mixture of experts' or GPT-2's Conv1D, a final
    logit soft-cap on more than one thread); off."""
    attention_backend: str = "auto"
    """auto | torch | triton"""
    enforce_eager: bool = False
    """Run every step eagerly: no CUDA graphs for decode-only steps (vLLM's --enforce-eager).
    CPU steps are always eager."""
    seed: int = 0
    jump_forward: bool = True
    """Structured outputs: tokens a request's grammar forces are proposed as drafts and computed
    in one chunk, verified by the step's samples (the output is the same as without)."""
    ngram_speculation: str = "auto"
    """auto | on | off: n-gram prompt-lookup drafts (engine/step/speculative.py), verified by the
    step's samples. auto is off: measured on the CPU path, drafting made streams slower."""
    prefill_pace_ms: float = 0.0
    """Prompt time a step with running streams may carry (engine/step/pacing.py); 0: none,
    every step takes prompt tokens up to the token budget. Off by default: served in turn on
    the default model (2-core EPYC, closed loop, 64 out), 50 ms made c=32 0.75x the tok/s
    and 2.5x the TTFT p99 of off (ITL p99 0.15x), c=8 0.80x."""
    long_prefill_ms: float = 50.0
    """Prompt time of any one request a step with running streams may carry (engine/step/
    pacing.py): a longer prompt beside streams that were running when it arrived is computed
    in chunks of that length, so no one request holds them for longer; 0: off (one chunk up to
    the token budget). A stream's
    longest gap is then about this plus its own decode step (6-15 ms at 1-8 streams on the
    default model): under the 100 ms issue 40 asks beside any one request."""
    num_threads: int | None = None
    """torch intra-op threads in the engine (CTranslate2's, in a speech engine); None: one per
    core."""
    compute_type: str = "default"
    """Speech engines: CTranslate2's compute type, e.g. int8, int8_float32, float32, float16:
    default keeps the type the model was saved in where the device computes it efficiently
    (float32 on a CPU without fast float16), auto picks the fastest the device supports."""
    stream_interval: int = 1
    """Frontend: a streaming consumer that keeps up gets its first token at once, then output
    every this many engine steps (and at the end). Larger values cost fewer wake-ups and SSE
    events per token, at the price of burstier streams."""
    enable_lora: bool = False
    """Serve LoRA adapters on this model (vLLM's --enable-lora): `max_loras` slots of rank up
    to `max_lora_rank` are allocated at start; `lora_modules` imply it."""
    max_loras: int = 4
    """Adapters loaded at once (vLLM's --max-loras); each costs its slot's memory up front."""
    max_lora_rank: int = 16
    """The largest adapter rank served (vLLM's --max-lora-rank): smaller ranks are padded to
    it, so a bound close to the adapters' ranks costs least."""
    lora_modules: dict[str, str] = msgspec.field(default_factory=dict)
    """Adapters loaded at start: served name -> PEFT adapter directory."""
    chat_template: str | None = None
    """Frontend: a Jinja chat template file used instead of the model's (vLLM's
    --chat-template); None: the model's own."""
    tool_call_parser: str | None = None
    """Frontend: this model's tool-call format (http/tools); None: the server's
    --tool-call-parser."""
    reasoning_parser: str | None = None
    """Frontend: this model's reasoning format (http/reasoning); None: the server's
    --reasoning-parser."""
    ring_capacity: int = 8 << 20
    """Bytes in each shared-memory ring."""
    startup_timeout: float = 300.0
    """Seconds to wait for the engine's ready message (model loading included)."""

    @property
    def lora(self) -> bool:
        """Adapters are served (asked for, or some given)."""
        return self.enable_lora or bool(self.lora_modules)

    def kv_cache_bytes(self, device: str = "cpu", free_bytes: int | None = None) -> int:
        """The KV cache's size on `device`, whose free memory (a GPU's, after the weights are
        loaded) is `free_bytes`; with no free memory known, auto means the CPU's size."""
        if self.kv_cache_memory != "auto":
            return parse_size(self.kv_cache_memory)
        fixed = device_defaults(device).kv_cache_bytes
        if fixed is not None:
            return fixed
        if free_bytes is None:  # checked before any device is at hand (the server's flags)
            return CPU_KV_CACHE_BYTES
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise ValueError(f"kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction}")
        return int(free_bytes * self.kv_cache_fraction)

    def step_token_budget(self, device: str) -> int:
        """max_num_batched_tokens, or the device's default."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return device_defaults(device).max_num_batched_tokens


class DeviceDefaults(msgspec.Struct, frozen=True):
    """What `EngineArgs` left unset (None, auto) means on a kind of device."""

    max_num_batched_tokens: int
    kv_cache_bytes: int | None
    """A fixed KV cache size; None: `kv_cache_fraction` of the free memory."""


DEVICE_DEFAULTS = {
    # 2048, vLLM's default for a CPU server: served in turn on the default model (AMX Xeon,
    # closed loop, 171-token prompts), 2048 gave 1.09x the tok/s of 512 at c=8 and 1.06x at
    # c=32, with 0.76x the TTFT p99 and a lower ITL p99 (fewer steps carry a prompt). A long
    # prompt then would hold running streams for one longer step instead of several short ones;
    # --long-prefill-ms bounds that. 1 GiB of KV holds 43k tokens of SmolLM2-135M in float32.
    "cpu": DeviceDefaults(max_num_batched_tokens=2048, kv_cache_bytes=CPU_KV_CACHE_BYTES),
    # A GPU step of a few hundred tokens is launch-bound: 8192 tokens (vLLM's offline default)
    # let prefills fill the matmuls; the KV cache takes most of the memory.
    "cuda": DeviceDefaults(max_num_batched_tokens=8192, kv_cache_bytes=None),
}


def device_defaults(device: str) -> DeviceDefaults:
    """`device`: cpu, cuda or cuda:N (as `loader.resolve_device` gives it)."""
    return DEVICE_DEFAULTS["cuda" if device.startswith("cuda") else "cpu"]
