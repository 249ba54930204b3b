"""The real server (tiny model, bf16, a 64-token context, --no-engine-restart, beside an embedding
model) under schemathesis and the hostile bodies of fuzz_bodies.py, then cross-talk in bf16, then
an engine death it must not survive. Derandomized unless TRIO_LLM_FUZZ says otherwise.

The tests share one server and run in order: the fuzzing must leave the engine alive and
serving (with restarts off, a dead engine would end the server), and the last test kills the
engine and checks the server exits non-zero.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import hypothesis.strategies as st
import pytest
import schemathesis
import trio
from cross_talk import alone_and_together, completion_body, prompts
from hypothesis import given
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from fuzz_bodies import (
    PINNED,
    base_bodies,
    embedding_bodies,
    fuzz_settings,
    hostile_bodies,
    mutated_bodies,
    spliced_bodies,
)
from http_server_process import ServerProcess, run_server
from trio_llm import __version__
from trio_llm.config import DEFAULT_EMBEDDING_MODEL
from trio_llm.http.ops.openapi import openapi_document

KEY = "sk-fuzz-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONCURRENT = 64


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    # A 64-token context bounds every generation the fuzzer can ask for.
    with run_server(
        f"{tiny_model_dir}:name=tiny",
        f"{DEFAULT_EMBEDDING_MODEL}:name=embed,dtype=float32",
        "--api-key", KEY,
        "--dtype", "bfloat16",
        "--max-model-len", "64",
        "--max-num-seqs", str(CONCURRENT),
        "--kv-cache-memory", "16MiB",
        "--no-engine-restart",
        "--shutdown-timeout", "5",
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def engine_at_start(server: ServerProcess) -> list[int]:
    return server.engine_pids()


@pytest.fixture(scope="module")
def api_schema(server: ServerProcess, engine_at_start: list[int]) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


OPERATIONS = [
    (method.upper(), path)
    for path, item in openapi_document(__version__)["paths"].items()
    for method in item
]


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_schemathesis_never_gets_a_5xx(
    api_schema: schemathesis.BaseSchema, method: str, path: str
) -> None:
    """Valid and invalid requests generated from /openapi.json. (schemathesis's own pytest
    plugin does not run under pytest 9, so the operation's strategy is driven directly.)"""
    operation = api_schema[path][method]
    cases = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )

    @given(case=cases)
    @fuzz_settings(30)
    def check(case: schemathesis.Case) -> None:
        if isinstance(case.body, dict) and "input" in case.body and "model" not in case.body:
            case.body["model"] = "embed"  # reach the embedding engine, not the default
        case.call_and_validate(headers=AUTH, checks=[not_a_server_error], timeout=60)

    check()


ROUTES = {
    **base_bodies("tiny"),
    **{f"embed:{route}": body for route, body in embedding_bodies("embed").items()},
}


@pytest.mark.parametrize(
    ("route", "raw"), PINNED, ids=[f"{r}-{i}" for i, (r, _) in enumerate(PINNED)]
)
def test_bodies_that_failed_once_never_get_a_5xx(
    server: ServerProcess, route: str, raw: bytes
) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(server.url + route, content=raw, headers=headers, timeout=60)
    assert response.status_code < 500, (raw[:200], response.text)
    assert "<state>" not in response.text


@pytest.mark.parametrize("route", ROUTES)
def test_hostile_bodies_never_get_a_5xx(server: ServerProcess, route: str) -> None:
    """The strategies of tests/http/test_http_fuzz.py, here reaching the real engines."""
    base, path = ROUTES[route], route.removeprefix("embed:")
    bodies = (
        mutated_bodies(base).map(lambda body: json.dumps(body).encode())
        | hostile_bodies(base, path).map(lambda body: json.dumps(body).encode())
        | spliced_bodies(base, enormous=20_000)
    )
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:

        @given(raw=bodies)
        @fuzz_settings(40)
        def check(raw: bytes) -> None:
            response = c.post(path, content=raw, headers={"Content-Type": "application/json"})
            assert response.status_code < 500, (raw[:200], response.text)

        check()


async def test_the_engines_survived_the_fuzzing(
    server: ServerProcess, engine_at_start: list[int]
) -> None:
    assert server.process.poll() is None
    assert server.engine_pids() == engine_at_start  # alive, never restarted
    m = await trio.to_thread.run_sync(server.wait_idle, 30.0)
    assert m["trio_llm_num_requests_running"] == m["trio_llm_num_requests_waiting"] == 0
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=60) as c:
        assert (await c.get("/health")).status_code == 200
        reply = await c.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
        )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4


async def test_bf16_differences_begin_only_at_near_ties(server: ServerProcess) -> None:
    """Greedy, so the first token where two runs part is where their top two candidates swap
    places; bf16 rounding that depends on the batch's shape may only do that when the two
    were within 0.05 in log-probability."""
    bodies = [
        completion_body(p, i, temperature=0, logprobs=2) for i, p in enumerate(prompts(CONCURRENT))
    ]
    async with httpx.AsyncClient(
        base_url=server.url,
        headers=AUTH,
        timeout=120,
        limits=httpx.Limits(max_connections=CONCURRENT),
    ) as c:
        alone, together = await alone_and_together(c, bodies)
    differing = 0
    for a, t in zip(alone, together, strict=True):
        tokens_a, tokens_t = a["logprobs"]["tokens"], t["logprobs"]["tokens"]
        if tokens_a == tokens_t:
            continue
        differing += 1
        first = next(i for i, (x, y) in enumerate(zip(tokens_a, tokens_t)) if x != y)
        top = a["logprobs"]["top_logprobs"][first]
        assert tokens_t[first] in top, (first, tokens_a, tokens_t, top)
        best, second = sorted(top.values(), reverse=True)
        assert best - second < 0.05, (first, tokens_a, tokens_t, top)
    assert differing <= CONCURRENT // 4  # near-ties are rare, not the rule


async def test_with_restarts_off_an_engine_death_ends_the_server(server: ServerProcess) -> None:
    """Last: it ends the module's server."""
    async with httpx.AsyncClient(base_url=server.url) as c:
        engines = (await c.get("/health")).json()["engines"]
    [engine] = [e["pid"] for e in engines if e["model"] == "tiny"]
    server.expected_exit = 1
    os.kill(engine, signal.SIGKILL)
    start = time.monotonic()
    await trio.to_thread.run_sync(server.process.wait, 30)
    assert time.monotonic() - start < 30
    log = "".join(server.log)
    assert "engine tiny[0] died and restarts are off" in log
