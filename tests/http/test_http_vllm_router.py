"""Two `trio-llm serve` processes behind vLLM's router (`vllm-router`, a real process), as
several machines would run behind it, on loopback: every API through its cache-aware,
round-robin and power-of-two policies; its KV-aware policy fed by the servers' KV-cache events;
stored responses shared through a real `redis-server`, so a conversation continues on either
server; and a worker killed mid-load, after which the survivor serves the rest.

The servers run the tiny model (with the default model's tokenizer) and the embedding model;
the router asks them for what it needs (`/health`, `/v1/models`, the render routes) in the
shapes it reads.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from http_server_process import ServerProcess, run_server

pytestmark = pytest.mark.slow

ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
REDIS = shutil.which("redis-server")

CHAT = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Say something."}],
    "max_tokens": 5,
    "temperature": 0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_flight(server: ServerProcess) -> float:
    metrics = server.metrics()
    return metrics["trio_llm_num_requests_running"] + metrics["trio_llm_num_requests_waiting"]


def wait_until(predicate, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if REDIS is None:
        pytest.skip("redis-server is not installed (scripts/bootstrap.sh installs it as root)")
    port = free_port()
    process = subprocess.Popen(
        [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def ready() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")

        wait_until(lambda: _quietly(ready), 20)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


def _quietly(check) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(check())
    except OSError:
        return False


@pytest.fixture(scope="module")
def workers(tiny_model_dir: Path, redis_url: str) -> Iterator[list[tuple[ServerProcess, str]]]:
    """Two servers, each publishing its KV events on its own port; [(server, events endpoint)]."""
    with ExitStack() as stack:
        started = []
        for _ in range(2):
            events = f"tcp://127.0.0.1:{free_port()}"
            config = (
                f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "{events}"}}'
            )
            args = [
                f"{tiny_model_dir}:name=tiny",
                "all-MiniLM-L6-v2:dtype=float32",
                "--kv-cache-memory", "16MiB",
                "--dtype", "float32",
                "--max-num-seqs", "8",
                "--kv-events-config", config,
                "--responses-store", redis_url,
                "--shutdown-timeout", "2",
            ]  # fmt: skip
            server = stack.enter_context(run_server(*args))
            started.append((server, events))
        yield started


@contextmanager
def run_router(policy: str, workers: list[tuple[ServerProcess, str]], *extra: str) -> Iterator[str]:
    port = free_port()
    command = [
        ROUTER,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--prometheus-port", str(free_port()),
        "--policy", policy,
        "--worker-urls", *(server.url for server, _ in workers),
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/v1/models", timeout=5).status_code == 200, 60)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


def chat_requests(server: ServerProcess) -> float:
    """The chat completions a server answered (its request counter)."""
    samples = server.labelled("trio_llm_http_requests_total")
    return sum(
        value for (method, route, status), value in samples.items()
        if route == "/v1/chat/completions" and status == "200"
    )  # fmt: skip


def test_every_api_works_through_the_cache_aware_router(
    workers: list[tuple[ServerProcess, str]],
) -> None:
    with run_router("cache_aware", workers) as url, httpx.Client(base_url=url, timeout=120) as c:
        names = {m["id"] for m in c.get("/v1/models").json()["data"]}
        assert names == {"tiny", "all-MiniLM-L6-v2"}
        reply = c.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 5
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code == 200 and lines[-1] == "data: [DONE]" and len(lines) >= 3
        completion = c.post(
            "/v1/completions", json={"model": "tiny", "prompt": "A", "max_tokens": 4}
        )
        assert completion.status_code == 200 and completion.json()["choices"][0]["text"]
        tool = {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]},
            },
        }  # fmt: skip
        called = c.post(
            "/v1/chat/completions",
            json={**CHAT, "max_tokens": 60, "tools": [tool], "tool_choice": "required"},
        )
        assert called.status_code == 200
        [call] = called.json()["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        first = c.post(
            "/v1/responses", json={"model": "tiny", "input": "Hello", "max_output_tokens": 4}
        )
        assert first.status_code == 200
        second = c.post(
            "/v1/responses",
            json={"model": "tiny", "input": "Again", "max_output_tokens": 4,
                  "previous_response_id": first.json()["id"]},
        )  # fmt: skip
        assert (
            second.status_code == 200
            and second.json()["previous_response_id"] == first.json()["id"]
        )
        embedded = c.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["a", "b"]})
        assert embedded.status_code == 200 and len(embedded.json()["data"]) == 2


@pytest.mark.parametrize("policy", ["round_robin", "power_of_two"])
def test_the_other_policies_spread_requests_over_both_servers(
    workers: list[tuple[ServerProcess, str]], policy: str
) -> None:
    before = [chat_requests(server) for server, _ in workers]
    with run_router(policy, workers) as url, httpx.Client(base_url=url, timeout=120) as c:
        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda _: c.post("/v1/chat/completions", json=CHAT), range(8)))
        assert all(r.status_code == 200 for r in replies)
        with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200 and list(r.iter_lines())[-2] == "data: [DONE]"
    after = [chat_requests(server) for server, _ in workers]
    served = [a - b for a, b in zip(after, before, strict=True)]
    assert sum(served) == 9 and all(n > 0 for n in served)
    for server, _ in workers:  # whatever the router asked (/get_load, render...), it exists
        unknown = [
            key for key in server.labelled("trio_llm_http_requests_total") if key[1] == "unmatched"
        ]
        assert not unknown


def test_a_response_stored_by_one_server_is_continued_and_read_on_the_other(
    workers: list[tuple[ServerProcess, str]],
) -> None:
    (a, _), (b, _) = workers
    first = httpx.post(
        a.url + "/v1/responses",
        json={"model": "tiny", "input": "Remember 7.", "max_output_tokens": 3},
        timeout=60,
    ).json()
    on_b = httpx.get(f"{b.url}/v1/responses/{first['id']}", timeout=10)
    assert on_b.status_code == 200 and on_b.json()["output"] == first["output"]
    second = httpx.post(
        b.url + "/v1/responses",
        json={"model": "tiny", "input": "And now?", "max_output_tokens": 3,
              "previous_response_id": first["id"]},
        timeout=60,
    )  # fmt: skip
    assert second.status_code == 200
    assert httpx.delete(f"{b.url}/v1/responses/{first['id']}", timeout=10).status_code == 200
    gone = httpx.get(f"{a.url}/v1/responses/{first['id']}", timeout=10)
    assert gone.status_code == 404


def test_the_kv_aware_router_sends_a_repeated_prompt_to_the_server_that_cached_it(
    workers: list[tuple[ServerProcess, str]],
) -> None:
    sources = [f"--kv-event-source={server.url}={events}" for server, events in workers]
    long_chat = {
        **CHAT,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "Tell me about the sea and its tides. " * 12}],
    }
    with (
        run_router("kv_aware", workers, *sources, "--kv-event-block-size", "16",
                   "--kv-event-model", "tiny") as url,
        httpx.Client(base_url=url, timeout=120) as c,
    ):  # fmt: skip
        before = [chat_requests(server) for server, _ in workers]
        assert c.post("/v1/chat/completions", json=long_chat).status_code == 200
        counts = [chat_requests(server) for server, _ in workers]
        [home] = [i for i in range(2) if counts[i] > before[i]]
        time.sleep(0.5)  # the events of its blocks reach the router
        for _ in range(4):
            assert c.post("/v1/chat/completions", json=long_chat).status_code == 200
        after = [chat_requests(server) for server, _ in workers]
    assert after[home] - counts[home] == 4 and after[1 - home] == counts[1 - home]


def test_a_worker_killed_mid_load_leaves_the_survivor_serving(
    workers: list[tuple[ServerProcess, str]],
) -> None:
    """Last in this module: it kills one of the module's servers."""
    (victim, _), (survivor, _) = workers
    # Long enough to be killed mid-way on a loaded machine (40 tokens could finish before the
    # victim's gauges showed them).
    body = {**CHAT, "max_tokens": 200, "ignore_eos": True}
    with run_router("round_robin", workers) as url, httpx.Client(base_url=url, timeout=120) as c:
        with ThreadPoolExecutor(8) as pool:
            started = time.monotonic()
            inflight = [pool.submit(c.post, "/v1/chat/completions", json=body) for _ in range(8)]
            wait_until(lambda: _in_flight(victim) > 0, 60)
            victim.expected_exit = -signal.SIGKILL
            victim.process.kill()
            statuses = [f.result(timeout=120).status_code for f in inflight]
        assert time.monotonic() - started < 120  # nothing hung
        assert statuses.count(200) >= 4  # the survivor's, and what the router retried there
        after = [c.post("/v1/chat/completions", json=CHAT).status_code for _ in range(6)]
    assert after == [200] * 6
    assert survivor.process.poll() is None
