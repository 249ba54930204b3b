"""Constrained serving, trio-llm against llama-cpp-python's server (bench/apis/structured.py's
`serving` section).

Every request is a streaming chat completion of one test schema's prompt with that schema as
`response_format` json_schema (strict), greedy, max_tokens 160; the schemas are sent in turn by
`c` closed-loop clients (each sends its next request when the last one ends). Per level: output
tokens per second (from `usage` when the server reports it, else content chunks), TTFT, the gap
between content chunks (ITL; a server that sends several tokens in one chunk, as jump-forward
does, shows fewer and longer gaps), TPOT ((end-to-end - TTFT) / (tokens - 1), which does not
depend on the chunking), and how many answers parse and validate against their schema.

The servers run one after the other on the same machine (bench/serving/servers.py starts and
stops each, bench/serving/peers/ says how); the load average before and after each is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from serving.peers import Server, Skipped, llama_cpp_server, trio_llm_server
from serving.servers import running
from structured_cases import SCHEMAS, assert_valid  # tests/structured_cases.py

MAX_TOKENS = 160


@dataclass
class Result:
    ok: bool
    valid: bool = False
    ttft: float = float("nan")
    e2e: float = float("nan")
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


def one_request(
    client: httpx.Client, url: str, model: str, case_index: int, llama: bool = False
) -> Result:
    """`llama`: llama-cpp-python's server (0.3.x) refuses response_format json_schema and takes
    the same schema as its own extension, `{"type": "json_object", "schema": ...}`."""
    case = SCHEMAS[case_index % len(SCHEMAS)]
    body = {
        **case.chat_body(model, MAX_TOKENS),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if llama:
        body["response_format"] = {"type": "json_object", "schema": case.schema}
    start = time.perf_counter()
    last = None
    text: list[str] = []
    chunks = 0
    usage = None
    result = Result(ok=False)
    try:
        with client.stream("POST", url + "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                result.error = f"{reply.status_code}: {reply.read()[:200]!r}"
                return result
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if not piece:
                        continue
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.gaps.append(now - last)
                    last = now
                    chunks += 1
                    text.append(piece)
    except httpx.HTTPError as exc:
        result.error = repr(exc)
        return result
    result.e2e = time.perf_counter() - start
    result.ok = True
    result.tokens = int(usage["completion_tokens"]) if usage else chunks
    try:
        assert_valid(case.schema, json.loads("".join(text)))
        result.valid = True
    except (ValueError, AssertionError, jsonschema.ValidationError) as exc:
        # An answer that does not parse or validate counts as invalid (a peer whose grammar
        # skips a keyword, say an integer's maximum, writes such answers).
        result.error = f"{case.name}: {exc}"[:300]
    return result


@dataclass
class Level:
    label: str
    concurrency: int
    results: list[Result]
    seconds: float

    def row(self) -> str:
        ok = [r for r in self.results if r.ok]
        if not ok:
            return f"| {self.label} | {self.concurrency} | {len(self.results)} | all failed |"
        tokens = sum(r.tokens for r in ok)
        gaps = [g for r in ok for g in r.gaps]
        tpots = [(r.e2e - r.ttft) / (r.tokens - 1) for r in ok if r.tokens > 1]
        valid = sum(r.valid for r in self.results)
        ms = 1e3
        return (
            f"| {self.label} | {self.concurrency} | {len(self.results)} | "
            f"{tokens / self.seconds:.1f} | {statistics.median(r.ttft for r in ok) * ms:.0f} | "
            f"{statistics.median(gaps) * ms:.1f} | {statistics.median(tpots) * ms:.1f} | "
            f"{statistics.mean(r.tokens for r in ok):.1f} | {valid}/{len(self.results)} |"
        )

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.results if r.ok) / self.seconds

    @property
    def tpot_p50(self) -> float:
        ok = [r for r in self.results if r.ok and r.tokens > 1]
        return statistics.median((r.e2e - r.ttft) / (r.tokens - 1) for r in ok)


def run_level(url: str, model: str, label: str, concurrency: int, num: int) -> Level:
    results: list[Result] = []
    lock = threading.Lock()
    counter = iter(range(num))

    def worker() -> None:
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                r = one_request(client, url, model, i, llama=label == llama_cpp_server.LABEL)
                with lock:
                    results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Level(label, concurrency, results, time.perf_counter() - start)


def servers(peers_dir: Path, trio_llm_args: list[str]) -> list[Server | Skipped]:
    ns = argparse.Namespace(peers_dir=peers_dir, trio_llm_args=trio_llm_args)
    return [*trio_llm_server.servers(ns), *llama_cpp_server.servers(ns)]


def measure(peers_dir: Path, trio_llm_args: list[str], levels: list[int], uptime: Any) -> str:
    table = [
        "| server | c | requests | output tok/s | TTFT p50 (ms) | ITL p50 (ms) | TPOT p50 (ms) "
        "| tokens/answer | valid |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    by_label: dict[str, dict[int, Level]] = {}
    for server in servers(peers_dir, trio_llm_args):
        if isinstance(server, Skipped):
            notes.append(f"- {server.label}: skipped, {server.reason}.")
            continue
        log = Path(f"/tmp/structured-{server.label.replace(' ', '_')}.log")
        before = uptime()
        with running(server, log, timeout=900) as (_, url):
            run_level(url, server.model, server.label, 1, 2)  # warm-up (compiles, caches)
            for c in levels:
                level = run_level(url, server.model, server.label, c, max(20, 5 * c))
                by_label.setdefault(server.label, {})[c] = level
                table.append(level.row())
                failures = [r.error for r in level.results if not r.valid]
                if failures:
                    first = failures[0].splitlines()[0] if failures[0] else "no error text"
                    notes.append(
                        f"- {server.label} c={c}: {len(failures)} invalid or failed; the first: "
                        f"{first}"
                    )
        notes.append(f"- {server.description}; load average {before} before, {uptime()} after.")
    ratios = []
    trio, llama = by_label.get(trio_llm_server.LABEL), by_label.get(llama_cpp_server.LABEL)
    if trio and llama:
        for c in levels:
            if c in trio and c in llama:
                ratios.append(
                    f"- c={c}: output tok/s ratio trio-llm / llama-cpp-python "
                    f"{trio[c].tokens_per_s / llama[c].tokens_per_s:.2f}; TPOT p50 "
                    f"{trio[c].tpot_p50 * 1e3:.1f} against {llama[c].tpot_p50 * 1e3:.1f} ms."
                )
    return "\n".join([*table, "", *ratios, "", *notes])
