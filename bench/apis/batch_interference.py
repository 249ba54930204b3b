"""Interactive time to first token with and without a batch running, side by side, on one real
server (`trio-llm serve MODEL --batch-dir ...`): does a batch stay below interactive traffic?

Interactive requests are streamed chat completions sent one after another with a pause between
them (a user's pace, which leaves the gaps a batch fills). Each round measures them twice: with
the server otherwise idle, then with a batch of long lines running (submitted through
/v1/batches and cancelled after the round); the rounds alternate so that whatever else the
machine does falls on both alike. The target (http/batch/runner.py): p50 and p99 TTFT within
10% of the idle figures.

    python bench/apis/batch_interference.py --requests 24 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the server process the tests use

import hostinfo  # noqa: E402
from http_server_process import run_server  # noqa: E402

RESULTS = BENCH / "results" / "batch_interference.md"


def ttfts(url: str, model: str, count: int, pause: float, max_tokens: int) -> list[float]:
    """`count` streamed chats one after another, `pause` seconds apart: each one's TTFT."""
    found = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for i in range(count):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"Tell me about the number {i}."}],
                "max_tokens": max_tokens,
                "stream": True,
            }
            start = time.perf_counter()
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():  # all of it, as a client reads it
                    if len(found) == i and line.startswith("data: ") and '"content"' in line:
                        found.append(time.perf_counter() - start)
            time.sleep(pause)
    return found


def start_batch(url: str, model: str, lines: int, max_tokens: int) -> str:
    requests = [
        {
            "custom_id": f"b{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Write a long story, number {i}."}],
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
        while client.get(f"/v1/batches/{batch['id']}").json()["status"] == "validating":
            time.sleep(0.05)
        time.sleep(1.0)  # lines in flight before the first interactive request
    return batch["id"]


def cancel_batch(url: str, batch_id: str) -> dict[str, object]:
    with httpx.Client(base_url=url, timeout=60) as client:
        client.post(f"/v1/batches/{batch_id}/cancel")
        while (batch := client.get(f"/v1/batches/{batch_id}").json())["status"] != "cancelled":
            time.sleep(0.05)
    return batch


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--requests", type=int, default=24, help="interactive, per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between requests")
    parser.add_argument("--max-tokens", type=int, default=16, help="of an interactive reply")
    parser.add_argument("--batch-lines", type=int, default=400)
    parser.add_argument("--batch-max-tokens", type=int, default=128)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    idle: list[float] = []
    busy: list[float] = []
    finished_lines = 0
    with (
        tempfile.TemporaryDirectory() as batch_dir,
        run_server(args.model, "--batch-dir", batch_dir, "--kv-cache-memory", "128MiB") as server,
    ):
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        ttfts(server.url, model, 2, 0.0, args.max_tokens)  # warm-up
        for _ in range(args.rounds):
            idle += ttfts(server.url, model, args.requests, args.pause, args.max_tokens)
            batch_id = start_batch(server.url, model, args.batch_lines, args.batch_max_tokens)
            busy += ttfts(server.url, model, args.requests, args.pause, args.max_tokens)
            cancelled = cancel_batch(server.url, batch_id)
            finished_lines += cancelled["request_counts"]["completed"]  # type: ignore[index]
            server.wait_idle(30)

    rows = [("no batch", idle), ("batch running", busy)]
    table = [
        "| interactive TTFT | n | p50 (ms) | p99 (ms) | mean (ms) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, values in rows:
        table.append(
            f"| {name} | {len(values)} | {percentile(values, 0.5) * 1e3:.1f} | "
            f"{percentile(values, 0.99) * 1e3:.1f} | {statistics.mean(values) * 1e3:.1f} |"
        )
    p50 = percentile(busy, 0.5) / percentile(idle, 0.5)
    p99 = percentile(busy, 0.99) / percentile(idle, 0.99)
    summary = (
        f"With the batch running: p50 x{p50:.2f}, p99 x{p99:.2f} of the idle figures "
        f"(target: within x1.10); the batch finished {finished_lines} lines meanwhile."
    )
    print("\n".join(table))
    print(summary)
    if args.no_write:
        return
    details = f"Model {args.model}; load average before: {Path('/proc/loadavg').read_text()[:4]}."
    report = [
        *hostinfo.heading("Interactive TTFT with and without a batch running", details),
        "",
        *table,
        "",
        summary,
        "",
    ]
    RESULTS.write_text("\n".join(report))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
