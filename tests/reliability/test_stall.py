"""One greedy stream runs while hostile bodies of every endpoint go in, on a fresh server (so the
first constrained request and the first with tools and a tool-call history are among them):
its largest gap between two chunks stays under 100 ms plus the step time, plus the jitter the
machine shows without them (measured first, in the same run: a shared CPU adds its own).

The stream is read by another process (stall_streamer.py), so that encoding and sending the
bodies here never delays the reading it measures."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from http_server_process import ServerProcess, run_server
from trio_llm.config import DEFAULT_EMBEDDING_MODEL

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]
STREAMER = Path(__file__).with_name("stall_streamer.py")


def _schema(properties: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 5} for i in range(properties)},
    }


TOOLS = [
    {
        "type": "function",
        "function": {"name": f"tool_{i}", "description": "d" * 200, "parameters": _schema(20)},
    }
    for i in range(40)
]
HISTORY: list[dict[str, Any]] = []
for _i in range(20):
    arguments = json.dumps({"p1": "x" * 100})
    HISTORY += [
        {"role": "user", "content": "call it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{_i}", "type": "function",
             "function": {"name": "tool_1", "arguments": arguments}}]},
        {"role": "tool", "content": "ok " * 50, "tool_call_id": f"c{_i}"},
    ]  # fmt: skip

HOSTILE: list[tuple[str, str, Any]] = [
    ("a large schema, the first constraint", "/v1/chat/completions",
     {"messages": HI, "max_tokens": 4,
      "response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": _schema(1500)}}}),
    ("tools and a tool-call history", "/v1/chat/completions",
     {"messages": HISTORY[-6:], "tools": TOOLS[:8], "max_tokens": 4}),
    ("40 tools, a long history", "/v1/chat/completions",
     {"messages": HISTORY, "tools": TOOLS, "tool_choice": "required", "max_tokens": 4}),
    ("20,000 messages", "/v1/chat/completions", {"messages": HI * 20_000, "max_tokens": 4}),
    ("a 2 MB prompt", "/v1/completions", {"prompt": "word " * 400_000, "max_tokens": 4}),
    ("a choice of 20,000", "/v1/completions",
     {"prompt": "hi", "max_tokens": 4, "guided_choice": [f"choice {i}" for i in range(20_000)]}),
    ("a schema nested 900 deep", "/v1/completions",
     {"prompt": "hi", "guided_json": json.loads('{"items":' * 900 + "{}" + "}" * 900)}),
    ("text.format", "/v1/responses",
     {"input": "hi", "max_output_tokens": 4,
      "text": {"format": {"type": "json_schema", "name": "x", "schema": _schema(300)}}}),
    ("Responses tools", "/v1/responses",
     {"input": "hi", "max_output_tokens": 4,
      "tools": [{"type": "function", "name": f"t{i}", "parameters": _schema(20)}
                for i in range(40)]}),
    ("256 embeddings", "/v1/embeddings",
     {"model": "embed", "input": [f"text number {i} " * 5 for i in range(256)]}),
    ("tokenize a tool history", "/tokenize", {"messages": HISTORY}),
    ("invocations", "/invocations", {"prompt": "hi", "guided_regex": "\U000bff35"}),
    ("a 17 MB body", "/v1/completions", {"prompt": "x" * (17 << 20)}),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with run_server(
        f"{tiny_model_dir}:name=tiny",
        f"{DEFAULT_EMBEDDING_MODEL}:name=embed",
        "--dtype", "float32",
        "--kv-cache-memory", "32MiB",
        "--shutdown-timeout", "2",
    ) as s:  # fmt: skip
        yield s


def _gaps(path: Path) -> list[tuple[float, float]]:
    """(arrival, gap since the chunk before) of every chunk but a stream's first."""
    gaps, last = [], None
    for line in path.read_text().splitlines():
        if line == "restart":
            last = None
            continue
        now = float(line)
        if last is not None:
            gaps.append((now, now - last))
        last = now
    return gaps


def test_hostile_bodies_do_not_stall_a_stream(server: ServerProcess, tmp_path: Path) -> None:
    times = tmp_path / "times"
    streamer = subprocess.Popen([sys.executable, str(STREAMER), server.url, str(times), "600"])
    try:
        deadline = time.monotonic() + 120
        while not times.exists() or len(times.read_text().splitlines()) < 150:
            assert time.monotonic() < deadline and streamer.poll() is None
            time.sleep(0.1)
        marks = []
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for label, route, body in HOSTILE:
                raw = json.dumps(body).encode()
                start = time.time()
                reply = client.post(
                    route, content=raw, headers={"Content-Type": "application/json"}
                )
                marks.append((label, start, time.time(), reply.status_code))
                assert reply.status_code < 500, (label, reply.text[:300])
                time.sleep(0.3)
    finally:
        streamer.terminate()
        streamer.wait(10)
    gaps = _gaps(times)
    before = [g for t, g in gaps if t < marks[0][1]]
    step = statistics.median(before)
    allowed = 0.100 + step + (max(before) - step)
    report = [f"step {step * 1e3:.1f} ms, jitter {(max(before) - step) * 1e3:.1f} ms"]
    worst = 0.0
    for label, start, end, status in marks:
        during = [g for t, g in gaps if start <= t <= end + 0.3]
        largest = max(during, default=0.0)
        worst = max(worst, largest)
        report.append(
            f"{label}: {status} in {end - start:.2f} s, largest gap {largest * 1e3:.0f} ms"
        )
    print(f"allowed {allowed * 1e3:.0f} ms:", *report, sep="\n")
    assert worst <= allowed, f"allowed {allowed * 1e3:.0f} ms:\n" + "\n".join(report)


def test_each_stalling_case_beside_a_canary_completes(
    server: ServerProcess, tmp_path: Path
) -> None:
    """Issue 40's cases, each beside a running stream, on this fresh server: a first chat
    request with tools and a tool-call history whose arguments are not JSON, a JSON schema
    enum of 10,000 values, and a 2,048-input /pooling request (its answer encoded off the
    event loop) all complete correctly, and the stream keeps streaming. Their gaps are
    bench/apis/stalls.py's to measure, not this test's."""
    times = tmp_path / "times"
    streamer = subprocess.Popen([sys.executable, str(STREAMER), server.url, str(times), "600"])
    history = [
        {"role": "user", "content": "call it"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c0", "type": "function",
             "function": {"name": "tool_1", "arguments": "{p1: 'not json"}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c0"},
    ]  # fmt: skip
    small_tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": _schema(4)}}
        for i in range(3)
    ]
    values = [f"v{i}" for i in range(10_000)]
    enum = {"type": "object", "properties": {"pick": {"enum": values}}, "required": ["pick"]}
    texts = [f"text {i}" for i in range(2048)]
    try:
        deadline = time.monotonic() + 120
        while not times.exists() or len(times.read_text().splitlines()) < 20:
            assert time.monotonic() < deadline and streamer.poll() is None
            time.sleep(0.1)
        with httpx.Client(base_url=server.url, timeout=300) as client:
            tools = client.post(
                "/v1/chat/completions",
                json={"model": "tiny", "messages": history, "tools": small_tools, "max_tokens": 8},
            )
            assert tools.status_code == 200, tools.text
            assert tools.json()["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
            chosen = client.post(
                "/v1/chat/completions",
                json={
                    "model": "tiny",
                    "messages": HI,
                    "max_tokens": 40,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": enum},
                    },
                },
            )
            assert chosen.status_code == 200, chosen.text
            choice = chosen.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                assert json.loads(choice["message"]["content"])["pick"] in values
            pooled = client.post("/pooling", json={"model": "embed", "input": texts})
            assert pooled.status_code == 200, pooled.text[:300]
            data = pooled.json()["data"]
            assert [d["index"] for d in data] == list(range(2048))
            some = client.post("/v1/embeddings", json={"model": "embed", "input": texts[-3:]})
            for got, want in zip(data[-3:], some.json()["data"], strict=True):
                assert got["data"] == pytest.approx(want["embedding"], abs=1e-5)
        before = len(times.read_text().splitlines())
        time.sleep(1.0)
        assert streamer.poll() is None and len(times.read_text().splitlines()) > before
    finally:
        streamer.terminate()
        streamer.wait(10)
