"""The `trio-llm serve` command line: one argparse definition, which the CLI parses argv with and
`create_app()` (for people who run Hypercorn themselves) parses an empty argv with, so every
flag also reads its default from the environment as `TRIO_LLM_<FLAG>` (e.g. TRIO_LLM_API_KEY,
TRIO_LLM_MAX_QUEUED_REQUESTS).

What it owns: the positional models (or TRIO_LLM_MODEL, whitespace-separated; each with its own
options: model_specs.py), the server's own flags (listening, keys and TLS, CORS, admission,
limits, stored responses, sampling defaults, tool and reasoning parsers, restarts, the chat
page), each defaulting to `ServerConfig`'s own default, then the engine's flags
(engine_flags.py); and `parse_serve_args` / `config_from_env`, argv or the environment to a
checked `ServerConfig` (config.py).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence

from trio_llm.config import DEFAULT_MODEL
from trio_llm.http.config import ServerConfig, config_from_args
from trio_llm.http.engine_flags import add_engine_flags
from trio_llm.http.flag_values import (
    boolean,
    env_value,
    flag_adder,
    non_negative_int,
    positive_int,
    seconds,
    size,
)
from trio_llm.http.media.policy import add_media_flags
from trio_llm.http.reasoning.formats import PARSER_NAMES as REASONING_PARSERS
from trio_llm.http.sampling import RequestLimits
from trio_llm.http.tools.formats import PARSER_NAMES


class _Repeated(argparse.Action):
    """Collects a repeated flag's values into a list; the first one given replaces the default
    (from the environment), as a flag given once does, rather than adding to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or items is self.default else list(items)
        items.append(values)
        setattr(namespace, self.dest, items)


def add_serve_arguments(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> None:
    """The `serve` flags; each default comes from TRIO_LLM_<FLAG> when that is set."""
    env = os.environ if environ is None else environ
    defaults = ServerConfig()
    add = flag_adder(parser, env)
    parser.add_argument(
        "model",
        nargs="*",
        metavar="MODEL[:OPTION=VALUE,...]",
        default=(env_value("model", env) or DEFAULT_MODEL).split(),
        help=f"models to serve, each its own engine: {DEFAULT_MODEL} (default), "
        "all-MiniLM-L6-v2 (embeddings), whisper-tiny.en or whisper-base (speech to text), a "
        "Hugging Face directory, a CTranslate2 Whisper directory, a .gguf file, or a hub id "
        "already in the local cache; options after a colon apply to that model only: name, "
        "task, dtype, device, kv, max-len, seqs, threads, compute, dp (e.g. "
        "all-MiniLM-L6-v2:dtype=float32,dp=2, whisper-tiny.en:compute=int8,threads=2)",
    )
    add("--host", default=defaults.host, help="address to listen on (default %(default)s)")
    add("--port", default=defaults.port, type=int, help="port (default %(default)s)")
    add(
        "--api-key",
        action=_Repeated,
        metavar="KEY[:ROLE][,...]",
        help="require `Authorization: Bearer KEY` on /v1 and the tokenizer routes; repeat the "
        "flag or separate keys with commas for several; a key given as KEY:priority may ask for "
        "a `priority` more urgent (lower) than the default 0, which other keys get a 403 for "
        "(any key may ask for a later one); without any key the server is open and every "
        "request may ask for any priority",
    )
    add(
        "--thinking-secret",
        help="the key Anthropic thinking blocks' signatures are sealed (HMAC-SHA256) and verified "
        "with when passed back; default: random per process, so signatures do not survive a "
        "restart or span several frontends",
    )
    add(
        "--protect-all-routes",
        default=False,
        type=boolean,
        nargs="?",
        const=True,
        help="require the key on /health, /metrics, /version and /openapi.json too",
    )
    add("--certfile", help="TLS certificate (PEM); serves HTTPS with ALPN h2 and http/1.1")
    add("--keyfile", help="TLS private key (PEM)")
    add(
        "--allow-runtime-lora-updating",
        default=False,
        type=boolean,
        nargs="?",
        const=True,
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING); they read adapter directories on this machine",
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
        "--allowed-origins",
        default="",
        help="comma-separated CORS origins, or '*'; CORS is off unless given",
    )
    add(
        "--max-queued-requests",
        type=non_negative_int,
        help="sequences each replica may queue beyond --max-num-seqs; past that (times the "
        "model's live replicas), requests for that model get 503 with Retry-After "
        "(default: --max-num-seqs)",
    )
    add(
        "--max-embedding-inputs",
        default=RequestLimits().max_embedding_inputs,
        type=positive_int,
        help="inputs one /v1/embeddings request may hold (default %(default)s)",
    )
    add(
        "--responses-store-size",
        default=defaults.responses_store_size,
        type=non_negative_int,
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
        type=seconds,
        help="seconds a stored response is kept after its last use; 0 keeps it until evicted "
        "(default %(default)s)",
    )
    add(
        "--batch-dir",
        help="serve OpenAI's Files and Batch APIs (/v1/files, /v1/batches), keeping files and "
        "batch state in this directory; a restarted server resumes unfinished batches",
    )
    add(
        "--max-body-size",
        default=defaults.max_body_size,
        type=size,
        help="largest request body, e.g. 16MiB; bigger ones get 413 (default 16MiB)",
    )
    add(
        "--max-audio-size",
        default=defaults.max_audio_size,
        type=size,
        help="largest audio file of /v1/audio/transcriptions and /translations, e.g. 25MiB; "
        "bigger ones get 413 naming `file` (default 25MiB)",
    )
    add(
        "--max-audio-seconds",
        default=defaults.max_audio_seconds,
        type=seconds,
        help="longest audio one transcription or translation may hold; longer gets 413 "
        "naming `file` (default %(default)s)",
    )
    add(
        "--shutdown-timeout",
        default=defaults.shutdown_timeout,
        type=seconds,
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
        "'llama3_json' (Llama 3.x JSON calls), 'mistral' ([TOOL_CALLS]), 'pythonic' (Llama "
        "3.2/4), 'qwen3_coder', 'deepseek_v3', 'granite', 'openai' (gpt-oss's Harmony), or "
        "'auto' (from the model's chat template); a model's own is MODEL:tools=FORMAT "
        "(default %(default)s)",
    )
    add(
        "--reasoning-parser",
        default=defaults.reasoning_parser,
        choices=list(REASONING_PARSERS),
        help="how a model's thinking is split from its answer (reasoning_content, reasoning "
        "items, thinking blocks): 'deepseek_r1' (the output thinks until </think>), 'qwen3' "
        "(it opens <think> itself), 'mistral' ([THINK]), 'granite', 'openai' (gpt-oss's "
        "analysis channel; also gpt_oss), 'none', or 'auto' (from the model's chat "
        "template); a model's own is MODEL:reasoning=FORMAT (default %(default)s)",
    )
    add(
        "--no-engine-restart",
        default=False,
        type=boolean,
        nargs="?",
        const=True,
        help="exit non-zero when the engine dies instead of restarting it",
    )
    add(
        "--no-ui",
        default=False,
        type=boolean,
        nargs="?",
        const=True,
        help="do not serve the chat page at / (404 there)",
    )
    add_media_flags(add)
    add_engine_flags(add)


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
