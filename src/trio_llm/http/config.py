"""ServerConfig: everything `trio-llm serve` and `create_app()` are told, checked.

What it owns: the `ServerConfig` type (the served models with their engines and replicas, and
the server's own settings, each with its default) and `config_from_args`, which checks parsed
flags and makes one. The flags themselves are defined once (serve_flags.py for the server's,
engine_flags.py for each model's engine; the positional models' own options are model_specs.py),
so the CLI, `create_app()` and the TRIO_LLM_* environment all read that one definition.

Invariant: a ServerConfig is complete and checked; nothing downstream reads the environment
again.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from trio_llm.config import EngineArgs
from trio_llm.http.api_keys import ApiKeys, parse_api_keys
from trio_llm.http.engine_flags import model_specs_from
from trio_llm.http.media.policy import MediaPolicy, media_policy_of
from trio_llm.http.model_specs import ModelSpec
from trio_llm.http.sampling import RequestLimits

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
    """`--api-key` as given: keys, comma-separated, each `KEY` or `KEY:ROLE` (`api_keys`)."""
    thinking_secret: str | None = None
    """The key of Anthropic thinking blocks' signatures (http/anthropic/signing.py); None: a
    random one per process (signatures then die with it and differ between frontends)."""
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
    media: MediaPolicy = field(default_factory=MediaPolicy)
    """Where a request's pictures may come from, and how many and how large
    (--allowed-media-domains, --allowed-local-media-path, --limit-mm-per-prompt, ...)."""
    prefix_routing: bool = True
    """A model's replicas are chosen cache-aware (client/prefix_index.py); False: the least
    loaded."""
    batch_dir: Path | None = None
    """Where the Files and Batch APIs keep files and batches (http/batch/); None: not served."""

    @property
    def api_keys(self) -> ApiKeys | None:
        """The keys with their roles; None: an open server, where any request may do anything."""
        return parse_api_keys(self.api_key)

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


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The checked config of parsed `serve` flags (serve_flags.py); `ValueError` naming the flag
    at fault."""
    if (args.certfile is None) != (args.keyfile is None):
        raise ValueError("--certfile and --keyfile go together")
    specs = model_specs_from(args)
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
    api_key = args.api_key
    if isinstance(api_key, list):  # the flag repeated
        api_key = ",".join(api_key)
    parse_api_keys(api_key)  # a ValueError naming the flag, now rather than at the first request
    return ServerConfig(
        engine=specs[0].args,
        models=specs,
        host=args.host,
        port=args.port,
        api_key=api_key or None,
        thinking_secret=args.thinking_secret or None,
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
        media=media_policy_of(args),
        batch_dir=Path(args.batch_dir) if args.batch_dir else None,
    )
