"""Interactive time to first token with and without a batch running, and the batch's throughput
with and without the interactive load, on one real server (`trio-llm serve MODEL --batch-dir
...`) per source tree, the trees served in turn in one sitting: does a batch stay below
interactive traffic, and does it still finish?

The interactive load is `--users` (4) streamed chat clients, each sending `--requests` chats one
after another with `--pause` seconds between them (a user's pace). TTFT is the time to the
first chunk that carries generated text (not the role-only chunk the server sends before any
token: the report before 2026-12-05 timed that one, which measures the HTTP edge, not the
engine). Each round, for each source: a warm-up (one phase of the load and a few batch
lines, discarded); the load alone; a batch of `--alone-lines` short lines alone (its lines/s);
a batch of `--batch-lines` short lines submitted and the same load beside it (TTFT, and the
lines the batch finished meanwhile, per second), the batch waited for to its end (it must
complete); the load alone again, so that drift in a shared VM falls on both sides. The target
(issue 43): TTFT p99 with the batch within 10% of the load alone.

    python bench/apis/batch_interference.py --sources before=/tmp/before/src after=src \\
        --batch-lines 1000 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the server process the tests use

import hostinfo  # noqa: E402
from http_server_process import run_server  # noqa: E402

RESULTS = BENCH / "results" / "batch_interference.md"


def first_token_time(client: httpx.Client, body: dict[str, object]) -> float:
    """One streamed chat's time to its first chunk with generated text (read to its end)."""
    start = time.perf_counter()
    found = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        for line in response.iter_lines():
            if found is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    found = time.perf_counter() - start
    assert found is not None, "no text came back"
    return found


def interactive_load(
    url: str, model: str, users: int, count: int, pause: float, max_tokens: int
) -> list[float]:
    """`users` clients, each `count` streamed chats `pause` seconds apart: every TTFT."""
    found: list[float] = []

    def user(u: int) -> None:
        with httpx.Client(base_url=url, timeout=300) as client:
            for i in range(count):
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"Tell me about the number {u}{i}."}],
                    "max_tokens": max_tokens,
                    "stream": True,
                }
                found.append(first_token_time(client, body))
                time.sleep(pause)

    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return found


def submit_batch(url: str, model: str, lines: int, max_tokens: int, tag: str) -> str:
    requests = [
        {
            "custom_id": f"{tag}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Write a haiku, number {i}."}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
        }
        for i in range(lines)
    ]
    data = "".join(json.dumps(r) + "\n" for r in requests).encode()
    with httpx.Client(base_url=url, timeout=60) as client:
        file = client.post(
            "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
        ).json()
        batch = client.post(
            "/v1/batches",
            json={
                "input_file_id": file["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ).json()
    return batch["id"]


def batch_state(url: str, batch_id: str) -> dict[str, object]:
    return httpx.get(f"{url}/v1/batches/{batch_id}", timeout=60).json()


def completed(url: str, batch_id: str) -> int:
    return batch_state(url, batch_id)["request_counts"]["completed"]  # type: ignore[index]


def wait_batch(url: str, batch_id: str, timeout: float) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while (batch := batch_state(url, batch_id))["status"] not in (
        "completed",
        "failed",
        "expired",
        "cancelled",
    ):
        if time.monotonic() > deadline:
            httpx.post(f"{url}/v1/batches/{batch_id}/cancel", timeout=60)
            return batch
        time.sleep(0.1)
    return batch


@dataclass
class Source:
    name: str
    path: str
    idle: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    alone_rate: list[float] = field(default_factory=list)
    """Batch lines/s with nothing else running, one per round."""
    beside_rate: list[float] = field(default_factory=list)
    """Batch lines/s while the load ran, one per round."""
    finish_s: list[float] = field(default_factory=list)
    """Seconds from submission to the end of the big batch, one per round."""
    statuses: list[str] = field(default_factory=list)
    loads: list[str] = field(default_factory=list)


def run_round(source: Source, args: argparse.Namespace) -> None:
    os.environ["PYTHONPATH"] = str(Path(source.path).resolve())
    load = lambda: source.loads.append(Path("/proc/loadavg").read_text()[:4])  # noqa: E731
    with (
        tempfile.TemporaryDirectory() as batch_dir,
        run_server(args.model, "--batch-dir", batch_dir, "--kv-cache-memory", "128MiB") as server,
    ):
        url = server.url
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        # Warm-up: a whole phase of the load, discarded (the first steps of each new shape
        # are slower, which would fall on the idle phase alone), and a few batch lines.
        interactive_load(url, model, args.users, args.requests, args.pause, args.max_tokens)
        wait_batch(url, submit_batch(url, model, 8, args.batch_max_tokens, "w"), 120)
        load()
        source.idle += interactive_load(
            url, model, args.users, args.requests, args.pause, args.max_tokens
        )
        start = time.perf_counter()
        small = submit_batch(url, model, args.alone_lines, args.batch_max_tokens, "a")
        state = wait_batch(url, small, args.batch_timeout)
        assert state["status"] == "completed", state
        source.alone_rate.append(args.alone_lines / (time.perf_counter() - start))
        server.wait_idle(30)
        load()
        start = time.perf_counter()
        big = submit_batch(url, model, args.batch_lines, args.batch_max_tokens, "b")
        time.sleep(1.0)  # lines in flight before the first interactive request
        before, t0 = completed(url, big), time.perf_counter()
        source.busy += interactive_load(
            url, model, args.users, args.requests, args.pause, args.max_tokens
        )
        source.beside_rate.append((completed(url, big) - before) / (time.perf_counter() - t0))
        state = wait_batch(url, big, args.batch_timeout)
        source.finish_s.append(time.perf_counter() - start)
        source.statuses.append(str(state["status"]))
        server.wait_idle(30)
        load()
        source.idle += interactive_load(  # alone again: drift falls on both sides
            url, model, args.users, args.requests, args.pause, args.max_tokens
        )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def report(sources: list[Source], args: argparse.Namespace) -> list[str]:
    lines = [
        "| source | interactive TTFT | n | p50 (ms) | p99 (ms) | mean (ms) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in sources:
        for name, values in (("no batch", s.idle), ("batch running", s.busy)):
            lines.append(
                f"| {s.name} | {name} | {len(values)} | {percentile(values, 0.5) * 1e3:.1f} | "
                f"{percentile(values, 0.99) * 1e3:.1f} | {statistics.mean(values) * 1e3:.1f} |"
            )
    lines += [
        "",
        "| source | TTFT p50 ratio | TTFT p99 ratio | batch lines/s alone | beside the load | "
        f"{args.batch_lines}-line batch: end, seconds | load average (each phase) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in sources:
        p50 = percentile(s.busy, 0.5) / percentile(s.idle, 0.5)
        p99 = percentile(s.busy, 0.99) / percentile(s.idle, 0.99)
        rates = lambda xs: " / ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        ends = ", ".join(f"{st} {t:.0f}" for st, t in zip(s.statuses, s.finish_s))
        lines.append(
            f"| {s.name} | x{p50:.2f} | x{p99:.2f} | {rates(s.alone_rate)} | "
            f"{rates(s.beside_rate)} | {ends} | {', '.join(s.loads)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument(
        "--sources", nargs="+", default=["this=src"], help="NAME=PATH: source trees to serve"
    )
    parser.add_argument("--users", type=int, default=4, help="interactive clients at once")
    parser.add_argument("--requests", type=int, default=24, help="per client, per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between a client's")
    parser.add_argument("--max-tokens", type=int, default=16, help="of an interactive reply")
    parser.add_argument("--batch-lines", type=int, default=1000, help="the batch beside the load")
    parser.add_argument("--alone-lines", type=int, default=100, help="the batch timed alone")
    parser.add_argument("--batch-max-tokens", type=int, default=16, help="a short line's")
    parser.add_argument("--batch-timeout", type=float, default=1800.0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    sources = [Source(*s.split("=", 1)) for s in args.sources]
    for r in range(args.rounds):
        for source in sources if r % 2 == 0 else sources[::-1]:  # alternate who goes first
            run_round(source, args)
            print(f"round {r + 1}: {source.name} done", flush=True)

    table = report(sources, args)
    print("\n".join(table))
    if args.no_write:
        return
    details = (
        f"Model {args.model}; {args.users} users x {args.requests} chats a phase, "
        f"{args.pause} s apart, {args.max_tokens} tokens; batch lines {args.batch_max_tokens} "
        f"tokens; {args.rounds} rounds, the sources alternating."
    )
    out = [
        *hostinfo.heading("Interactive TTFT with and without a batch running", details),
        "",
        *table,
        "",
    ]
    RESULTS.write_text("\n".join(out))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
