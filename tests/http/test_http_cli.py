"""`trio-llm serve` flags and their TRIO_LLM_* environment defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trio_llm.cli import build_parser
from trio_llm.config import DEFAULT_MODEL
from trio_llm.http.serve_flags import config_from_env, parse_serve_args
from trio_llm.http.server import hypercorn_config


def test_defaults() -> None:
    config = parse_serve_args([], {})
    assert config.engine.model == DEFAULT_MODEL
    assert config.engine.step_token_budget("cpu") == 2048
    assert (config.host, config.port, config.api_key) == ("127.0.0.1", 8000, None)
    assert config.allowed_origins == ()
    assert config.max_queued_requests is None
    # Admission is on by default: each replica admits as many queued as running sequences.
    assert config.replica_capacity(config.model_specs[0]) == 2 * config.engine.max_num_seqs
    assert config.restart_engine


def test_every_flag() -> None:
    config = parse_serve_args(
        [
            "/models/tiny",
            "--host", "0.0.0.0",
            "--port", "9000",
            "--served-model-name", "tiny",
            "--api-key", "k",
            "--certfile", "c.pem",
            "--keyfile", "k.pem",
            "--max-model-len", "256",
            "--max-num-seqs", "4",
            "--max-num-batched-tokens", "1024",
            "--long-prefill-ms", "20",
            "--kv-cache-memory", "64MiB",
            "--dtype", "float32",
            "--device", "cpu",
            "--num-threads", "2",
            "--stream-interval", "4",
            "--single-token-dtype", "float16",
            "--batch-invariant", "on",
            "--model-impl", "transformers",
            "--enforce-eager",
            "--allowed-origins", "https://a.example, https://b.example",
            "--max-queued-requests", "8",
            "--max-body-size", "1MiB",
            "--shutdown-timeout", "2.5",
            "--log-level", "debug",
            "--protect-all-routes",
            "--no-engine-restart",
        ],
        {},
    )  # fmt: skip
    e = config.engine
    assert (e.model, e.served_model_name, e.max_model_len, e.max_num_seqs) == (
        "/models/tiny",
        "tiny",
        256,
        4,
    )
    assert (e.kv_cache_memory, e.dtype, e.device) == ("64MiB", "float32", "cpu")
    assert e.step_token_budget("cpu") == 1024 and e.long_prefill_ms == 20
    assert (e.num_threads, e.stream_interval, e.single_token_dtype) == (2, 4, "float16")
    assert (e.batch_invariant, e.model_impl, e.enforce_eager) == ("on", "transformers", True)
    assert (config.host, config.port, config.api_key) == ("0.0.0.0", 9000, "k")
    assert config.allowed_origins == ("https://a.example", "https://b.example")
    assert config.max_queued_requests == 8
    assert config.replica_capacity(config.model_specs[0]) == 12
    assert (config.max_body_size, config.shutdown_timeout, config.log_level) == (
        1 << 20,
        2.5,
        "debug",
    )
    assert config.protect_all_routes and not config.restart_engine
    hc = hypercorn_config(config)
    assert hc.bind == ["0.0.0.0:9000"]
    assert hc.alpn_protocols == ["h2", "http/1.1"]
    assert hc.graceful_timeout == 2.5
    # Hypercorn waits for the lifespan (the engine's start) as long as the engine may take.
    assert hc.startup_timeout == e.startup_timeout


def test_environment_supplies_defaults_and_flags_win() -> None:
    env = {
        "TRIO_LLM_API_KEY": "from-env",
        "TRIO_LLM_PORT": "7000",
        "TRIO_LLM_MODEL": "/m",
        "TRIO_LLM_MAX_QUEUED_REQUESTS": "3",
        "TRIO_LLM_PROTECT_ALL_ROUTES": "true",
    }
    config = config_from_env(env)
    assert (config.api_key, config.port, config.engine.model) == ("from-env", 7000, "/m")
    assert config.max_queued_requests == 3 and config.protect_all_routes
    assert parse_serve_args(["--port", "7001"], env).port == 7001


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--port", "x"], {}),
        (["--max-num-seqs", "0"], {}),
        (["--max-num-batched-tokens", "0"], {}),
        (["--long-prefill-ms", "-1"], {}),
        (["--prefill-pace-ms", "nan"], {}),
        (["--stream-interval", "0"], {}),
        (["--single-token-dtype", "float64"], {}),
        (["--batch-invariant", "sometimes"], {}),
        (["--model-impl", "vllm"], {}),
        (["--kv-cache-memory", "lots"], {}),
        (["--dtype", "int3"], {}),
        (["--certfile", "c.pem"], {}),
        (["--shutdown-timeout", "-1"], {}),
        (["--generation-config", "/no/such/dir"], {}),
        ([], {"TRIO_LLM_DTYPE": "int3"}),
        ([], {"TRIO_LLM_PORT": "x"}),
    ],
)
def test_bad_flags_exit_2_with_a_message(
    argv: list[str], env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_serve_args(argv, env)
    assert info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_generation_config_flag(tmp_path: Path) -> None:
    assert parse_serve_args([], {}).generation_config == "auto"
    assert parse_serve_args(["--generation-config", "none"], {}).generation_config == "none"
    env = {"TRIO_LLM_GENERATION_CONFIG": "vllm"}
    assert parse_serve_args([], env).generation_config == "vllm"
    (tmp_path / "generation_config.json").write_text("{}")
    config = parse_serve_args(["--generation-config", str(tmp_path)], {})
    assert config.generation_config == str(tmp_path)


def test_cli_has_serve() -> None:
    args = build_parser().parse_args(["serve", "--port", "1234"])
    assert (args.command, args.port) == ("serve", 1234)


def test_python_dash_m_serve_help() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trio_llm", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    for flag in ("--max-queued-requests", "--certfile", "--api-key", "--shutdown-timeout"):
        assert flag in result.stdout


def test_several_models_with_their_own_options() -> None:
    config = parse_serve_args(
        [
            "SmolLM2-135M-Instruct",
            "all-MiniLM-L6-v2:dtype=float32,dp=2,name=minilm",
            "/models/with:colon",
            "--data-parallel-size", "3",
            "--kv-cache-memory", "256MiB",
            "--num-threads", "1",
        ],
        {},
    )  # fmt: skip
    chat, embed, path = config.models
    assert (chat.args.model, chat.replicas, chat.args.kv_cache_memory) == (
        "SmolLM2-135M-Instruct",
        3,
        "256MiB",
    )
    assert (embed.args.model, embed.args.served_model_name, embed.args.dtype) == (
        "all-MiniLM-L6-v2",
        "minilm",
        "float32",
    )
    assert embed.replicas == 2 and path.args.model == "/models/with:colon"
    assert config.engine == chat.args
    capped = parse_serve_args(["a", "b:seqs=3", "--max-queued-requests", "1"], {})
    assert [capped.replica_capacity(s) for s in capped.model_specs] == [129, 4]


def test_models_from_the_environment_and_threads_shared_between_engines() -> None:
    config = parse_serve_args([], {"TRIO_LLM_MODEL": "a:kv=1GiB b:task=embed,threads=3"})
    a, b = config.models
    assert a.args.kv_cache_memory == "1GiB" and b.args.task == "embed"
    assert b.args.num_threads == 3 and a.args.num_threads is not None


@pytest.mark.parametrize(
    "argv",
    [
        ["m:colour=red"],
        ["m:dtype=int3"],
        ["m:task=chat"],
        ["m:dp=0"],
        ["m:kv=lots"],
        ["a", "a"],
        ["a", "b", "--served-model-name", "x"],
    ],
)
def test_bad_model_entries_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(argv, {})
    assert "error:" in capsys.readouterr().err
