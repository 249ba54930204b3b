"""ServerConfig: everything `trio-llm serve` and `create_app()` are told, and where it comes from.

One argparse definition is the single source of truth: the CLI parses argv with it, and
`create_app()` (for people who run Hypercorn themselves) parses an empty argv, so every flag
also reads its default from the environment as `TRIO_LLM_<FLAG>` (e.g. TRIO_LLM_API_KEY,
TRIO_LLM_MAX_QUEUED_REQUESTS). The models to serve are the positional arguments (or
TRIO_LLM_MODEL, whitespace-separated), each with its own options (model_specs.py). Invariant:
a ServerConfig is complete and checked; nothing downstream reads the environment again.

Why over 400 lines: the argparse definition of every flag is here, in one place, on purpose
(the CLI, `create_app()` and the TRIO_LLM_* environment all read that one definition).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trio_llm.config import DEFAULT_MODEL, EngineArgs, parse_size
from trio_llm.http.model_specs import (
    DTYPES,
    LoraModule,
    ModelSpec,
    ModelSpecError,
    model_specs,
    with_lora_modules,
)
from trio_llm.http.reasoning.formats import PARSER_NAMES as REASONING_PARSERS
from trio_llm.http.sampling import RequestLimits
from trio_llm.http.tools.formats import PARSER_NAMES
from trio_llm.tasks import TASKS

ENV_PREFIX = "TRIO_LLM_"
GENERATION_CONFIG_MODES = ("auto", "none", "vllm")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    engine: EngineArgs = field(default_factory=EngineArgs)
    """The one model's engine (the first model's, when several are served)."""
    models: tuple[ModelSpec, ...] = ()
    """Every served model with its replicas, in order; empty: `engine`, once."""
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    protect_all_routes: bool = False
    """Require the key on /health, /metrics, /version and /openapi.json too."""
    certfile: str | None = None
    keyfile: str | None = None
    allowed_origins: tuple[str, ...] = ()
    """CORS origins ('*' for any); empty: no CORS headers at all."""
    max_queued_requests: int | None = None
    """Sequences each replica may queue beyond its --max-num-seqs before new requests for its
    model get 503; None: as many as it runs (admission is on by default)."""
    max_body_size: int = 16 << 20
    """Largest JSON body."""
    max_audio_size: int = 25 << 20
    """Largest audio file of a transcription or translation (OpenAI's own limit)."""
    max_audio_seconds: float = 1800.0
    """Longest audio a transcription or translation may hold, in seconds."""
    shutdown_timeout: float = 30.0
    """Seconds in-flight requests get to finish on SIGINT/SIGTERM before they are aborted."""
    log_level: str = "info"
    limits: RequestLimits = field(default_factory=RequestLimits)
    restart_engine: bool = True
    """Restart a dead engine (with backoff); False: exit non-zero instead."""
    generation_config: str = "auto"
    """Where requests that leave temperature, top_p, top_k, min_p or repetition_penalty unset
    get them from: `auto` the model's generation_config.json, `vllm` or `none` OpenAI's
    defaults, or a directory holding a generation_config.json (vLLM's --generation-config)."""
    max_restarts_per_minute: int = 3
    tool_call_parser: str = "auto"
    """The format tool calls are prompted, constrained and parsed in (http/tools/formats.py):
    `hermes`, `llama3_json`, or `auto` (picked from each model's chat template)."""
    reasoning_parser: str = "auto"
    """How a model's thinking is split from its answer (http/reasoning/formats.py):
    `deepseek_r1`, `qwen3`, `none`, or `auto` (from each model's chat template: a template that
    writes `<think>` and `</think>`)."""
    ui: bool = True
    """Serve the chat page at / (http/ui/endpoint.py)."""
    responses_store_size: int = 1024
    """Responses kept in memory for GET /v1/responses/{id} and previous_response_id, the least
    recently used evicted first; 0 keeps none."""
    allow_runtime_lora_updating: bool = False
    """Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM keeps them behind
    VLLM_ALLOW_RUNTIME_LORA_UPDATING: they read directories on the server's machine)."""
    responses_store: str | None = None
    """Where stored responses live: None (memory, this process) or a redis:// URL that several
    frontends share behind a router."""
    responses_store_ttl: float = 0.0
    """Seconds a stored response is kept after its last use; 0: until evicted."""
    prefix_routing: bool = True
    """A model's replicas are chosen cache-aware (client/prefix_index.py); False: the least
    loaded."""

    @property
    def model_specs(self) -> tuple[ModelSpec, ...]:
        return self.models or (ModelSpec(self.engine),)

    def replica_capacity(self, spec: ModelSpec) -> int:
        """Sequences one live replica of `spec`'s model admits (running plus queued) before
        requests for that model get 503: a model's capacity is this times its live replicas."""
        queued = self.max_queued_requests
        running = spec.args.max_num_seqs
        return running + (running if queued is None else queued)

    @property
    def tls(self) -> bool:
        return self.certfile is not None


def _env(name: str, environ: Mapping[str, str]) -> str | None:
    return environ.get(ENV_PREFIX + name.upper().replace("-", "_"))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, got {text}")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_serve_arguments(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> None:
    """The `serve` flags; each default comes from TRIO_LLM_<FLAG> when that is set."""
    env = os.environ if environ is None else environ
    defaults = ServerConfig()
    engine = EngineArgs()

    def add(flag: str, *, default: object = None, **kw: object) -> None:
        name = flag.removeprefix("--")
        raw = _env(name, env)
        if raw is not None:
            choices = kw.get("choices")
            if choices is not None and raw not in choices:  # type: ignore[operator]
                parser.error(
                    f"{ENV_PREFIX}{name.upper().replace('-', '_')}={raw!r}: not one of "
                    f"{', '.join(choices)}"
                )  # type: ignore[arg-type]
            default = raw  # argparse runs a string default through `type`, as if typed
        parser.add_argument(flag, default=default, **kw)  # type: ignore[arg-type]

    parser.add_argument(
        "model",
        nargs="*",
        metavar="MODEL[:OPTION=VALUE,...]",
        default=(_env("model", env) or DEFAULT_MODEL).split(),
        help=f"models to serve, each its own engine: {DEFAULT_MODEL} (default), "
        "all-MiniLM-L6-v2 (embeddings), whisper-tiny.en or whisper-base (speech to text), a "
        "Hugging Face directory, a CTranslate2 Whisper directory, a .gguf file, or a hub id "
        "already in the local cache; options after a colon apply to that model only: name, "
        "task, dtype, device, kv, max-len, seqs, threads, compute, dp (e.g. "
        "all-MiniLM-L6-v2:dtype=float32,dp=2, whisper-tiny.en:compute=int8,threads=2)",
    )
    add("--host", default=defaults.host, help="address to listen on (default %(default)s)")
    add("--port", default=defaults.port, type=int, help="port (default %(default)s)")
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
        type=_positive_int,
        help="engine processes (replicas) per model; each request goes to the one with the "
        "fewest sequences in flight (default %(default)s)",
    )
    add("--api-key", help="require `Authorization: Bearer KEY` on /v1 and the tokenizer routes")
    add(
        "--protect-all-routes",
        default=False,
        type=_bool,
        nargs="?",
        const=True,
        help="require the key on /health, /metrics, /version and /openapi.json too",
    )
    add("--certfile", help="TLS certificate (PEM); serves HTTPS with ALPN h2 and http/1.1")
    add("--keyfile", help="TLS private key (PEM)")
    add("--max-model-len", type=_positive_int, help="context length (default: the model's)")
    add(
        "--max-num-seqs",
        default=engine.max_num_seqs,
        type=_positive_int,
        help="sequences the engine runs at once (default %(default)s)",
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
        type=_positive_int,
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
        help="the same request gets the same tokens alone or batched with others: auto turns "
        "it on where a start-up probe finds it free (bfloat16 on oneDNN), on forces it "
        "(padded matmuls where needed, 2-3x slower lone streams in float32), off (default "
        "%(default)s)",
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
        type=_bool,
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
        type=_positive_int,
        help="LoRA adapters loaded at once per model; each slot's memory is taken at start "
        "(default %(default)s)",
    )
    add(
        "--max-lora-rank",
        default=engine.max_lora_rank,
        type=_positive_int,
        help="the largest LoRA rank served; smaller ranks are padded to it (default %(default)s)",
    )
    add(
        "--allow-runtime-lora-updating",
        default=False,
        type=_bool,
        nargs="?",
        const=True,
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING); they read adapter directories on this machine",
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
        "--data-parallel-routing",
        choices=["prefix", "least-loaded"],
        default="prefix",
        help="which replica of a model takes a request: prefix (the one holding the longest "
        "cached prefix of its prompt, unless its load exceeds the others' by SGLang's bounds) "
        "or least-loaded (default %(default)s)",
    )
    add(
        "--enforce-eager",
        default=engine.enforce_eager,
        type=_bool,
        nargs="?",
        const=True,
        help="run every step eagerly: no CUDA graphs for decode-only steps (a CPU is always eager)",
    )
    add(
        "--stream-interval",
        type=_positive_int,
        default=engine.stream_interval,
        help="streamed responses get their first token at once, then an event every N engine "
        "steps (default %(default)s: every step)",
    )
    add(
        "--no-jump-forward",
        default=False,
        type=_bool,
        nargs="?",
        const=True,
        help="structured outputs: decode the tokens a grammar forces one step each, instead of "
        "proposing them all at once (the output is the same either way)",
    )
    add(
        "--allowed-origins",
        default="",
        help="comma-separated CORS origins, or '*'; CORS is off unless given",
    )
    add(
        "--max-queued-requests",
        type=_non_negative_int,
        help="sequences each replica may queue beyond --max-num-seqs; past that (times the "
        "model's live replicas), requests for that model get 503 with Retry-After "
        "(default: --max-num-seqs)",
    )
    add(
        "--max-embedding-inputs",
        default=RequestLimits().max_embedding_inputs,
        type=_positive_int,
        help="inputs one /v1/embeddings request may hold (default %(default)s)",
    )
    add(
        "--responses-store-size",
        default=defaults.responses_store_size,
        type=_non_negative_int,
        help="responses kept in memory for GET /v1/responses/{id} and previous_response_id; "
        "past that the least recently used is evicted; 0 keeps none (default %(default)s)",
    )
    add(
        "--responses-store",
        help="where stored responses live: memory (default, this process) or a redis:// URL "
        "shared by several servers behind a router, so previous_response_id works on any",
    )
    add(
        "--responses-store-ttl",
        default=defaults.responses_store_ttl,
        type=_seconds,
        help="seconds a stored response is kept after its last use; 0 keeps it until evicted "
        "(default %(default)s)",
    )
    add(
        "--max-body-size",
        default=defaults.max_body_size,
        type=_size,
        help="largest request body, e.g. 16MiB; bigger ones get 413 (default 16MiB)",
    )
    add(
        "--max-audio-size",
        default=defaults.max_audio_size,
        type=_size,
        help="largest audio file of /v1/audio/transcriptions and /translations, e.g. 25MiB; "
        "bigger ones get 413 naming `file` (default 25MiB)",
    )
    add(
        "--max-audio-seconds",
        default=defaults.max_audio_seconds,
        type=_seconds,
        help="longest audio one transcription or translation may hold; longer gets 413 "
        "naming `file` (default %(default)s)",
    )
    add(
        "--shutdown-timeout",
        default=defaults.shutdown_timeout,
        type=_seconds,
        help="on SIGINT/SIGTERM, seconds in-flight requests get before they are aborted "
        "(default %(default)s)",
    )
    add(
        "--log-level",
        default=defaults.log_level,
        choices=["debug", "info", "warning", "error"],
        help="(default %(default)s)",
    )
    add(
        "--generation-config",
        default=defaults.generation_config,
        help="sampling defaults for requests that do not set temperature, top_p, top_k, min_p "
        "or repetition_penalty: 'auto' (the model's generation_config.json), 'none' (OpenAI's "
        "defaults; 'vllm' is the same), or a directory with a generation_config.json "
        "(default %(default)s)",
    )
    add(
        "--tool-call-parser",
        default=defaults.tool_call_parser,
        choices=list(PARSER_NAMES),
        help="the format of tool calls: 'hermes' (<tool_call> tags, SmolLM2, Qwen, Hermes), "
        "'llama3_json' (Llama 3.x JSON calls), or 'auto' (from the model's chat template) "
        "(default %(default)s)",
    )
    add(
        "--reasoning-parser",
        default=defaults.reasoning_parser,
        choices=list(REASONING_PARSERS),
        help="how a model's thinking is split from its answer (reasoning_content, reasoning "
        "items, thinking blocks): 'deepseek_r1' (the output thinks until </think>), 'qwen3' "
        "(it opens <think> itself), 'none', or 'auto' (from the model's chat template) "
        "(default %(default)s)",
    )
    add(
        "--no-engine-restart",
        default=False,
        type=_bool,
        nargs="?",
        const=True,
        help="exit non-zero when the engine dies instead of restarting it",
    )
    add(
        "--no-ui",
        default=False,
        type=_bool,
        nargs="?",
        const=True,
        help="do not serve the chat page at / (404 there)",
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    if (args.certfile is None) != (args.keyfile is None):
        raise ValueError("--certfile and --keyfile go together")
    engine = EngineArgs(
        model=args.model[0] if args.model else DEFAULT_MODEL,
        served_model_name=args.served_model_name,
        task=args.task,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        kv_cache_memory=args.kv_cache_memory,
        num_threads=args.num_threads,
        stream_interval=args.stream_interval,
        single_token_dtype=args.single_token_dtype,
        jump_forward=not args.no_jump_forward,
        batch_invariant=args.batch_invariant,
        model_impl=args.model_impl,
        quantization=args.quantization,
        ngram_speculation=args.ngram_speculation,
        enforce_eager=args.enforce_eager,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank,
        scheduling_policy=args.scheduling_policy,
        **kv_events_fields(args.kv_events_config),
    )
    engine.kv_cache_bytes()  # a bad size fails here, at start-up, not in the engine process
    try:
        specs = model_specs(args.model or [DEFAULT_MODEL], engine, replicas=args.data_parallel_size)
        specs = with_lora_modules(specs, _lora_modules(args.lora_modules))
    except ModelSpecError as error:
        raise ValueError(str(error)) from None
    store = args.responses_store or None
    if store not in (None, "memory") and not store.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--responses-store {store!r}: give memory or a redis:// URL")
    origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
    generation_config = args.generation_config
    if (
        generation_config not in GENERATION_CONFIG_MODES
        and not (Path(generation_config) / "generation_config.json").is_file()
    ):
        raise ValueError(
            f"--generation-config {generation_config!r}: give auto, none, vllm, or a "
            "directory that holds a generation_config.json"
        )
    return ServerConfig(
        engine=specs[0].args,
        models=specs,
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        protect_all_routes=args.protect_all_routes,
        certfile=args.certfile,
        keyfile=args.keyfile,
        allowed_origins=origins,
        max_queued_requests=args.max_queued_requests,
        max_body_size=args.max_body_size,
        max_audio_size=args.max_audio_size,
        max_audio_seconds=args.max_audio_seconds,
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
        restart_engine=not args.no_engine_restart,
        limits=RequestLimits(max_embedding_inputs=args.max_embedding_inputs),
        generation_config=generation_config,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        ui=not args.no_ui,
        responses_store_size=args.responses_store_size,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        responses_store=args.responses_store or None,
        responses_store_ttl=args.responses_store_ttl,
        prefix_routing=args.data_parallel_routing == "prefix",
    )


def _lora_modules(entries: Sequence[str] | str) -> list[LoraModule]:
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


def config_from_env(environ: Mapping[str, str] | None = None) -> ServerConfig:
    """The config `create_app()` uses: every flag at its TRIO_LLM_* value or default."""
    return parse_serve_args([], environ)


def parse_serve_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser(prog="trio-llm serve")
    add_serve_arguments(parser, environ)
    args = parser.parse_args(list(argv))
    try:
        return config_from_args(args)
    except ValueError as error:
        parser.error(str(error))
