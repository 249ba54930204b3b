"""The `trio-llm serve` flags each served model's engine is made of, and the engines they make.

What it owns: the engine's flags (the model's name and task, dtype, device, memory, batching,
quantization, LoRA, scheduling, KV-cache events, ...), each defaulting to `EngineArgs`'s own
default, and `model_specs_from`, which turns the parsed flags into one `ModelSpec` per
positional model (its own `:option=value` overrides: model_specs.py), with the LoRA adapters of
--lora-modules. The server's own flags are serve_flags.py's.

Invariant: whatever can be found wrong in the engine's flags (a KV-cache size, a model option, a
--lora-modules or --kv-events-config entry) raises `ValueError` here, at start-up, naming the
flag, never later in an engine process.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

from trio_llm.config import DEFAULT_MODEL, EngineArgs
from trio_llm.http.flag_values import AddFlag, boolean, non_negative_float, positive_int
from trio_llm.http.model_specs import (
    DTYPES,
    LoraModule,
    ModelSpec,
    ModelSpecError,
    model_specs,
    with_lora_modules,
)
from trio_llm.tasks import TASKS


def add_engine_flags(add: AddFlag) -> None:
    """The engine's flags, added with `add` (flag_values.py)."""
    engine = EngineArgs()
    add("--served-model-name", help="the name clients use as `model` (default: the model's name)")
    add(
        "--task",
        default=engine.task,
        choices=list(TASKS),
        help="auto (embeddings from an encoder, generation from a decoder), generate, or "
        "embed (a decoder serves embeddings, last-token pooling) (default %(default)s)",
    )
    add(
        "--data-parallel-size",
        default=1,
        type=positive_int,
        help="engine processes (replicas) per model; each request goes to the one with the "
        "fewest sequences in flight (default %(default)s)",
    )
    add("--max-model-len", type=positive_int, help="context length (default: the model's)")
    add(
        "--chat-template",
        help="a Jinja chat template file used instead of the model's (a model's own: "
        "MODEL:chat-template=PATH) (default: the model's)",
    )
    add(
        "--max-num-seqs",
        default=engine.max_num_seqs,
        type=positive_int,
        help="sequences the engine runs at once (default %(default)s)",
    )
    add(
        "--max-num-batched-tokens",
        type=positive_int,
        help="tokens one engine step may compute, prompt chunks and decodes together: "
        "larger steps prefill faster, smaller ones hold running streams less long "
        "(default: the device's, 2048 on a CPU, 8192 on CUDA)",
    )
    add(
        "--kv-cache-memory",
        default=engine.kv_cache_memory,
        help="KV cache size, e.g. 512MiB or 2GiB (default %(default)s)",
    )
    add(
        "--dtype",
        default=engine.dtype,
        choices=list(DTYPES),
        help="weights and activations (default %(default)s)",
    )
    add("--device", default=engine.device, help="auto, cpu, cuda or cuda:N (default %(default)s)")
    add(
        "--num-threads",
        type=positive_int,
        help="torch threads in the engine (default: one per core)",
    )
    add(
        "--single-token-dtype",
        choices=["none", "float16", "bfloat16"],
        default=engine.single_token_dtype,
        help="run steps that compute one token (a stream decoding alone) on weight copies in "
        "this dtype: ~1.6x faster such steps on a CPU, outputs differ slightly from batched "
        "ones (default %(default)s)",
    )
    add(
        "--batch-invariant",
        choices=["auto", "on", "off"],
        default=engine.batch_invariant,
        help="the same request gets the same tokens alone or batched with others, however "
        "its prompt is chunked: auto turns it on where the CPU's matmul plan passes its start-up "
        "check (off with quantized weights), on also pads matmuls where only that works and "
        "refuses to start where it cannot be kept (CUDA, --single-token-dtype, mixtures of "
        "experts), off (default %(default)s)",
    )
    add(
        "--quantization",
        choices=["auto", "none", "int8", "int4", "w8a8"],
        default=engine.quantization,
        help="auto: a quantized GGUF runs in its own formats (int4/int8 kernels, bfloat16 "
        "activations), anything else in its float dtype; none: dequantize a GGUF to --dtype; "
        "int8 / int4: quantize a float checkpoint at load, weight-only; w8a8: int8 weights "
        "and int8 activations, fastest for batches and prefills (default %(default)s)",
    )
    add(
        "--ngram-speculation",
        choices=["auto", "on", "off"],
        default=engine.ngram_speculation,
        help="draft tokens by n-gram prompt lookup, verified in the next step: on drafts for "
        "every stream without a seed, penalties or a grammar; auto is off, as measured on a "
        "CPU it made streams slower (default %(default)s)",
    )
    add(
        "--prefill-pace-ms",
        type=non_negative_float,
        default=engine.prefill_pace_ms,
        help="prompt time (ms, measured as the engine runs) a step with running streams may "
        "carry beside them, so a long prompt never holds the streams for long; its own first "
        "token comes later for it; 0: off, each step takes prompt tokens up to "
        "--max-num-batched-tokens (default %(default)s; 50 made a closed loop of 32 "
        "streams 0.75x the tok/s with 0.15x the ITL p99 on a 2-core CPU)",
    )
    add(
        "--long-prefill-ms",
        type=non_negative_float,
        default=engine.long_prefill_ms,
        help="prompt time (ms, measured as the engine runs) of any one request a step with "
        "running streams may carry: a longer prompt beside streams that were running when it "
        "arrived is computed in chunks of that length (at least 64 tokens), so no one request "
        "holds them for longer; 0: off (default %(default)s)",
    )
    add(
        "--model-impl",
        choices=["auto", "own", "transformers"],
        default=engine.model_impl,
        help="auto: the engine's own forward where one covers the model (the Llama family), "
        "transformers' modules with the paged attention for any other causal LM; own: refuse "
        "a model no own forward covers; transformers: transformers' modules for every model. "
        "The engine says at start-up which it took and why (default %(default)s)",
    )
    add(
        "--enable-lora",
        default=engine.enable_lora,
        type=boolean,
        nargs="?",
        const=True,
        help="serve LoRA adapters on the generating models: requests name one as `model` and "
        "run batched with the base model's (--lora-modules imply it)",
    )
    add(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT directories) served from the start, on the first model; or "
        'as vLLM\'s JSON, {"name": ..., "path": ..., "base_model_name": ...}, on the model '
        "named (a model's own are also its option lora=NAME=PATH)",
    )
    add(
        "--max-loras",
        default=engine.max_loras,
        type=positive_int,
        help="LoRA adapters loaded at once per model; each slot's memory is taken at start "
        "(default %(default)s)",
    )
    add(
        "--max-lora-rank",
        default=engine.max_lora_rank,
        type=positive_int,
        help="the largest LoRA rank served; smaller ranks are padded to it (default %(default)s)",
    )
    add(
        "--scheduling-policy",
        choices=["fcfs", "priority"],
        default=engine.scheduling_policy,
        help="fcfs: requests run in arrival order and a request's `priority` must be 0 (a 400 "
        "otherwise); priority: a lower `priority` runs first (default %(default)s)",
    )
    add(
        "--kv-events-config",
        help="publish KV-cache events for a KV-aware router, as vLLM does: JSON such as "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}\' '
        "(each further engine of the server takes the next port)",
    )
    add(
        "--enforce-eager",
        default=engine.enforce_eager,
        type=boolean,
        nargs="?",
        const=True,
        help="run every step eagerly: no CUDA graphs for decode-only steps (a CPU is always eager)",
    )
    add(
        "--stream-interval",
        type=positive_int,
        default=engine.stream_interval,
        help="streamed responses get their first token at once, then an event every N engine "
        "steps (default %(default)s: every step)",
    )
    add(
        "--no-jump-forward",
        default=False,
        type=boolean,
        nargs="?",
        const=True,
        help="structured outputs: decode the tokens a grammar forces one step each, instead of "
        "proposing them all at once (the output is the same either way)",
    )


def model_specs_from(args: argparse.Namespace) -> tuple[ModelSpec, ...]:
    """Each positional model's engine and replicas, from the parsed flags; `ValueError` naming
    the flag or model option at fault."""
    engine = EngineArgs(
        model=args.model[0] if args.model else DEFAULT_MODEL,
        served_model_name=args.served_model_name,
        task=args.task,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        chat_template=args.chat_template,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory=args.kv_cache_memory,
        num_threads=args.num_threads,
        stream_interval=args.stream_interval,
        single_token_dtype=args.single_token_dtype,
        jump_forward=not args.no_jump_forward,
        batch_invariant=args.batch_invariant,
        model_impl=args.model_impl,
        quantization=args.quantization,
        ngram_speculation=args.ngram_speculation,
        prefill_pace_ms=args.prefill_pace_ms,
        long_prefill_ms=args.long_prefill_ms,
        enforce_eager=args.enforce_eager,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        scheduling_policy=args.scheduling_policy,
        **kv_events_fields(args.kv_events_config),
    )
    engine.kv_cache_bytes()  # a bad size fails here, at start-up, not in the engine process
    if engine.chat_template is not None and not os.path.isfile(engine.chat_template):
        raise ValueError(f"--chat-template {engine.chat_template!r} is not a file")
    try:
        specs = model_specs(args.model or [DEFAULT_MODEL], engine, replicas=args.data_parallel_size)
        specs = with_lora_modules(specs, lora_modules(args.lora_modules))
    except ModelSpecError as error:
        raise ValueError(str(error)) from None
    return specs


def lora_modules(entries: Sequence[str] | str) -> list[LoraModule]:
    """--lora-modules entries: `NAME=PATH`, or vLLM's JSON object (with `base_model_name`)."""
    if isinstance(entries, str):  # from the environment: whitespace-separated
        entries = entries.split()
    modules = []
    for entry in entries:
        if entry.lstrip().startswith("{"):
            try:
                found = json.loads(entry)
                modules.append(
                    LoraModule(found["name"], found["path"], found.get("base_model_name"))
                )
            except (ValueError, KeyError, TypeError):
                raise ValueError(
                    f"--lora-modules {entry!r}: a JSON entry is an object with name, path and "
                    "optionally base_model_name"
                ) from None
            continue
        name, sep, path = entry.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules {entry!r}: give NAME=PATH")
        modules.append(LoraModule(name.strip(), path.strip()))
    return modules


_KV_EVENTS_KEYS = frozenset(
    {"enable_kv_cache_events", "publisher", "endpoint", "topic", "buffer_steps", "hwm"}
)


def kv_events_fields(text: str | None) -> dict[str, object]:
    """The engine fields vLLM's `--kv-events-config` JSON sets (its keys; the tuning ones
    our publisher does not need are accepted and ignored, the replay endpoint is refused: a
    router told to replay from it would wait on nothing)."""
    if not text:
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--kv-events-config is not JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError("--kv-events-config must be a JSON object")
    unknown = sorted(set(config) - _KV_EVENTS_KEYS)
    if unknown:
        raise ValueError(
            f"--kv-events-config: {', '.join(unknown)} not supported (known: "
            f"{', '.join(sorted(_KV_EVENTS_KEYS))})"
        )
    if not config.get("enable_kv_cache_events", False) or config.get("publisher") == "null":
        return {}
    if config.get("publisher", "zmq") != "zmq":
        raise ValueError("--kv-events-config: publisher must be zmq (or null)")
    endpoint = config.get("endpoint", "tcp://*:5557")
    topic = config.get("topic", "")
    if not isinstance(endpoint, str) or not isinstance(topic, str):
        raise ValueError("--kv-events-config: endpoint and topic must be strings")
    return {"kv_events_endpoint": endpoint, "kv_events_topic": topic}
