"""`trio-llm serve TINY --data-parallel-size 2` (a real server with two engine processes):
requests spread by load, a client's disconnect aborts its request on the replica that runs
it, a replica killed with SIGKILL fails only its own requests, /health says degraded until the
supervisor has restarted it, and nothing leaks (KV blocks, processes, memfds). Also: one model
that cannot start fails the start with its own error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import trio

from http_server_process import ServerProcess, fd_targets, run_server

LONG = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "max_tokens": 400,
    "ignore_eos": True,
    "temperature": 0,
}

LONG_STREAM = {**LONG, "max_tokens": 2000}
"""Streams that outlast the test's steps: the tiny model on the own forward decodes 400 tokens
in under a second, and the test needs its streams running while it cancels and starts others
(the last one is cancelled by the test, the others with it)."""


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with run_server(
        f"{tiny_model_dir}:name=tiny",
        "--data-parallel-size", "2",
        "--max-num-seqs", "8",
        "--kv-cache-memory", "16MiB",
        "--dtype", "float32",
    ) as s:  # fmt: skip
        yield s


def running(server: ServerProcess) -> dict[str, float]:
    samples = server.labelled("trio_llm_replica_num_requests_running")
    return {replica: value for (_, replica), value in samples.items()}


def wait_for(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def memfds(pid: int) -> list[str]:
    return [t for t in fd_targets(pid) if t.startswith("/memfd:")]


def test_start_up_shows_each_engines_progress(server: ServerProcess) -> None:
    log = "".join(server.log)
    for replica in ("tiny[0]", "tiny[1]"):
        assert f"engine {replica}: loading the weights" in log
    assert "serving tiny (float32, cpu, max_model_len=2048, 2 replicas)" in log
    assert len(server.engine_pids()) == 2


def story(topic: str) -> dict:  # type: ignore[type-arg]
    """A long stream whose prompt shares nothing with another topic's but the template's
    first block, so that load, not a cached prefix, decides its replica."""
    content = f"Tell me a story about {topic}. " * 8
    messages = [{"role": "user", "content": content}]
    return {**LONG_STREAM, "max_tokens": 1800, "stream": True, "messages": messages}


async def test_requests_spread_by_load_and_a_disconnect_aborts_on_its_replica(
    server: ServerProcess,
) -> None:
    scopes: list[trio.CancelScope] = []
    topics = iter(("ships", "bees", "clocks", "rain", "maps", "owls"))

    async def stream(scope: trio.CancelScope) -> None:
        body = story(next(topics))
        with scope:
            async with (
                httpx.AsyncClient(base_url=server.url, timeout=60) as c,
                c.stream("POST", "/v1/chat/completions", json=body) as r,
            ):
                async for _ in r.aiter_lines():
                    pass

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            scopes.append(trio.CancelScope())
            nursery.start_soon(stream, scopes[-1])
        await trio.to_thread.run_sync(lambda: wait_for(lambda: running(server) == {"0": 2, "1": 2}))
        loads = server.labelled("trio_llm_replica_load")
        assert set(loads.values()) == {2}
        scopes[0].cancel()  # the client hangs up: one replica drops to 1, the other keeps 2
        await trio.to_thread.run_sync(
            lambda: wait_for(lambda: sorted(running(server).values()) == [1, 2])
        )
        scopes.append(trio.CancelScope())
        nursery.start_soon(stream, scopes[-1])  # goes to the replica with one
        await trio.to_thread.run_sync(lambda: wait_for(lambda: running(server) == {"0": 2, "1": 2}))
        nursery.cancel_scope.cancel()
    m = await trio.to_thread.run_sync(server.wait_idle, 10.0)
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]
    assert set(server.labelled("trio_llm_replica_load").values()) == {0}


def test_a_killed_replica_fails_only_its_requests_and_comes_back(server: ServerProcess) -> None:
    def health() -> dict:  # type: ignore[type-arg]
        return httpx.get(server.url + "/health", timeout=10).json()

    engines = health()["engines"]
    victim, survivor = (next(e["pid"] for e in engines if e["replica"] == i) for i in (0, 1))
    fds_before = len(memfds(server.process.pid))
    with (
        httpx.Client(base_url=server.url, timeout=120) as c,
        ThreadPoolExecutor(4) as pool,
    ):
        bodies = [story(topic) for topic in ("ships", "bees", "clocks", "rain")]
        posts = [
            pool.submit(
                c.post, "/v1/chat/completions", json={**b, "stream": False, "max_tokens": 300}
            )
            for b in bodies
        ]
        wait_for(lambda: running(server) == {"0": 2, "1": 2})
        os.kill(victim, signal.SIGKILL)
        results = [p.result() for p in posts]
        degraded = c.get("/health")
    assert sorted(r.status_code for r in results) == [200, 200, 500, 500]
    for r in results:
        if r.status_code == 500:
            assert r.json()["error"]["code"] == "engine_dead"
        else:
            assert r.json()["usage"]["completion_tokens"] == 300
    # The survivor still serves, so the server is degraded, not down (unless the restart
    # already happened).
    assert degraded.status_code == 200 and degraded.json()["status"] in ("degraded", "ok")
    wait_for(lambda: health()["status"] == "ok", 120)
    engines = health()["engines"]
    assert [e["restarts"] for e in engines] == [1, 0] and engines[1]["pid"] == survivor
    pids = server.engine_pids()
    assert victim not in pids and survivor in pids and len(pids) == 2  # the dead one reaped
    assert not Path(f"/proc/{victim}").exists()
    assert len(memfds(server.process.pid)) == fds_before  # the dead replica's rings are gone
    restarts = server.labelled("trio_llm_replica_restarts_total")
    assert restarts == {("tiny", "0"): 1.0, ("tiny", "1"): 0.0}
    again = httpx.post(
        server.url + "/v1/chat/completions", json={**LONG, "max_tokens": 3}, timeout=60
    )
    assert again.status_code == 200
    m = server.wait_idle(10.0)
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]


def test_a_model_that_cannot_start_fails_the_start_with_its_own_error(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-model"
    command = [sys.executable, "-m", "trio_llm", "serve", str(tiny_model_dir), str(missing)]
    result = subprocess.run(
        [*command, "--port", "0", "--dtype", "float32", "--num-threads", "1"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 1
    assert f"{missing}[0]: cannot load the tokenizer" in result.stderr


def test_a_replica_that_gives_up_leaves_rotation_and_the_last_one_stops_the_server(
    tiny_model_dir: Path,
) -> None:
    with run_server(
        f"{tiny_model_dir}:name=tiny",
        "--data-parallel-size", "2",
        "--no-engine-restart",
        "--kv-cache-memory", "16MiB",
        "--dtype", "float32",
    ) as server:  # fmt: skip
        first, second = server.engine_pids()
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: httpx.get(server.url + "/health", timeout=10).json()["status"] != "ok")
        health = httpx.get(server.url + "/health", timeout=10)
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert sorted(e["retired"] for e in health.json()["engines"]) == [False, True]
        for topic in ("ships", "bees", "clocks"):  # all served by the one left
            body = {**story(topic), "stream": False, "max_tokens": 3}
            r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200
        server.expected_exit = 1
        os.kill(second, signal.SIGKILL)
        server.process.wait(timeout=60)
    assert "every replica of a model died and was not restarted" in "".join(server.log)
