"""LoRA adapters through a real server (`trio-llm serve TINY --lora-modules ...`, two replicas):
listed in /v1/models with their base as `parent`, named as `model` by the OpenAI SDK, loaded
and unloaded at run time on every replica through vLLM's routes, a stream in flight finishing
on an unloaded adapter, and OpenAI-shaped errors for what cannot be done."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from http_server_process import ServerProcess, run_server
from lora_adapters import ADAPTER_PROMPT as PROMPT
from lora_adapters import ADAPTER_TOKENS as TOKENS
from trio_llm.http.app import create_app
from trio_llm.http.serve_flags import parse_serve_args


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tiny_adapters: dict[str, Path]) -> Iterator[ServerProcess]:
    with run_server(
        f"{tiny_model_dir}:name=tiny,max-lora-rank=8",
        "--lora-modules", f"sql={tiny_adapters['sql']}",
        "--allow-runtime-lora-updating",
        "--data-parallel-size", "2",
        "--max-num-seqs", "4",
        "--kv-cache-memory", "16MiB",
        "--dtype", "float32",
        "--shutdown-timeout", "2",
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


def completion_tokens(sdk: openai.OpenAI, model: str) -> list[int]:
    reply = sdk.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    assert reply.model == model
    return reply.choices[0].model_extra["token_ids"]  # type: ignore[index]


def post(server: ServerProcess, route: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=60)


def test_models_lists_each_adapter_with_its_base_as_parent(
    sdk: openai.OpenAI, tiny_adapters: dict[str, Path]
) -> None:
    models = {m.id: m for m in sdk.models.list()}
    assert set(models) == {"tiny", "sql"}
    assert models["sql"].model_extra == {
        "max_model_len": 2048,
        "root": str(tiny_adapters["sql"]),
        "parent": "tiny",
    }
    assert "parent" not in (models["tiny"].model_extra or {})
    assert sdk.models.retrieve("sql").model_extra["parent"] == "tiny"  # type: ignore[index]


def test_the_openai_sdk_generates_with_an_adapter_as_model(
    sdk: openai.OpenAI, adapter_greedy: dict[str, list[int]]
) -> None:
    assert completion_tokens(sdk, "sql") == adapter_greedy["sql"]
    assert completion_tokens(sdk, "tiny") != adapter_greedy["sql"]
    chunks = list(
        sdk.chat.completions.create(
            model="sql",
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=6,
            stream=True,
        )
    )
    assert {c.model for c in chunks} == {"sql"}
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_adapters_load_and_unload_at_run_time_on_every_replica(
    server: ServerProcess,
    sdk: openai.OpenAI,
    tiny_adapters: dict[str, Path],
    adapter_greedy: dict[str, list[int]],
) -> None:
    loaded = post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "chat", "lora_path": str(tiny_adapters["chat"])},
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'chat' added successfully."
    assert "chat" in {m.id for m in sdk.models.list()}
    # Four requests: the two replicas (least loaded first) both serve it.
    assert [completion_tokens(sdk, "chat") for _ in range(4)] == [adapter_greedy["chat"]] * 4

    again = post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "chat", "lora_path": str(tiny_adapters["chat"])},
    )
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]

    unloaded = post(server, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert unloaded.status_code == 200
    assert unloaded.text == "Success: LoRA adapter 'chat' removed successfully."
    with pytest.raises(openai.NotFoundError) as error:
        completion_tokens(sdk, "chat")
    assert error.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert error.value.body["param"] == "model"  # type: ignore[index]
    missing = post(server, "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "The lora adapter 'chat' cannot be found."


def test_a_load_the_engines_refuse_is_a_400_with_the_reason(
    server: ServerProcess, sdk: openai.OpenAI, tiny_adapters: dict[str, Path]
) -> None:
    wide = post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "wide", "lora_path": str(tiny_adapters["wide"])},
    )
    assert wide.status_code == 400
    error = wide.json()["error"]
    assert "rank 16, over the engine's bound of 8" in error["message"]
    assert error["param"] == "lora_path"
    nowhere = post(server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/nonexistent"})
    assert nowhere.status_code == 400 and "no such adapter directory" in nowhere.text
    base = post(
        server,
        "/v1/load_lora_adapter",
        {"lora_name": "x", "lora_path": str(tiny_adapters["chat"]), "base_model_name": "nope"},
    )
    assert base.status_code == 404 and base.json()["error"]["param"] == "base_model_name"
    assert {m.id for m in sdk.models.list()} == {"tiny", "sql"}  # nothing half-loaded stays


def test_an_unload_lets_a_stream_in_flight_finish(
    server: ServerProcess, sdk: openai.OpenAI, tiny_adapters: dict[str, Path]
) -> None:
    body = {"lora_name": "story", "lora_path": str(tiny_adapters["chat"])}
    assert post(server, "/v1/load_lora_adapter", body).status_code == 200
    stream = sdk.completions.create(
        model="story",
        prompt=PROMPT,
        max_tokens=1500,  # seconds of decoding: it runs on past the unload
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [next(stream)]
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "story"}).status_code == 200
    assert server.metrics()["trio_llm_num_requests_running"] == 1
    chunks += list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.NotFoundError):
        completion_tokens(sdk, "story")
    server.wait_idle(timeout=5)


def test_lora_requests_info_names_the_adapters_running_as_vllms_does(
    server: ServerProcess, sdk: openai.OpenAI
) -> None:
    """llm-d's endpoint picker reads `vllm:lora_requests_info` (labels `max_lora`,
    `running_lora_adapters`, `waiting_lora_adapters`; the value the time it was set)."""
    stream = sdk.completions.create(
        model="sql",
        prompt=PROMPT,
        max_tokens=400,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    with stream:
        next(iter(stream))
        before = time.time()
        [(labels, value)] = server.labelled("vllm:lora_requests_info").items()
        assert labels == ("4", "sql", "") and abs(value - before) < 5
    server.wait_idle(10)
    assert list(server.labelled("vllm:lora_requests_info")) == [("4", "", "")]


def test_the_runtime_routes_are_not_served_without_the_flag() -> None:
    def routes(*argv: str) -> set[str]:
        app = create_app(parse_serve_args(list(argv), environ={}))
        return {rule.rule for rule in app.url_map.iter_rules()}

    assert "/v1/load_lora_adapter" not in routes("--enable-lora")
    on = routes("--allow-runtime-lora-updating")
    assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter"} <= on


def test_lora_modules_and_model_options_reach_the_engines(tmp_path: Path) -> None:
    config = parse_serve_args(
        [
            "a:lora=x=/adapters/x,lora=y=/adapters/y",
            "b:name=bee",
            "--lora-modules",
            "z=/adapters/z",
            json.dumps({"name": "w", "path": "/adapters/w", "base_model_name": "bee"}),
            "--max-lora-rank",
            "32",
        ],
        environ={},
    )
    a, b = (spec.args for spec in config.model_specs)
    assert a.lora_modules == {"x": "/adapters/x", "y": "/adapters/y", "z": "/adapters/z"}
    assert b.lora_modules == {"w": "/adapters/w"}
    assert a.lora and b.lora and a.max_lora_rank == 32
    with pytest.raises(SystemExit):
        parse_serve_args(["a:lora=x=/p", "--lora-modules", "x=/q"], environ={})
    with pytest.raises(SystemExit):
        parse_serve_args(["a", "--lora-modules", "a=/q"], environ={})


def test_a_restarted_replica_comes_back_with_the_adapters_loaded_at_run_time(
    server: ServerProcess,
    sdk: openai.OpenAI,
    tiny_adapters: dict[str, Path],
    adapter_greedy: dict[str, list[int]],
) -> None:
    body = {"lora_name": "chat", "lora_path": str(tiny_adapters["chat"])}
    assert post(server, "/v1/load_lora_adapter", body).status_code == 200
    health = httpx.get(server.url + "/health", timeout=10).json()
    victim = health["engines"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:
        engines = httpx.get(server.url + "/health", timeout=10).json()["engines"]
        if engines[0]["restarts"] == 1 and all(e["alive"] for e in engines):
            break
        assert time.monotonic() < deadline, "the replica did not restart"
        time.sleep(0.2)
    # Both replicas serve it (the least loaded takes each: they alternate).
    assert [completion_tokens(sdk, "chat") for _ in range(4)] == [adapter_greedy["chat"]] * 4
    assert completion_tokens(sdk, "sql") == adapter_greedy["sql"]
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "chat"}).status_code == 200
