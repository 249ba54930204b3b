"""Routing across replicas for prefix reuse: a multi-turn chat workload on two replicas.

Conversations share a system prompt and grow turn by turn (each turn sends the whole
history: system prompt, earlier questions and answers, the new question), the workload where
routing decides whether a replica finds a conversation's history in its prefix cache. Four
set-ups run side by side in one sitting, on the same conversations:

- in one server (`trio-llm serve --data-parallel-size 2`): `--data-parallel-routing prefix`
  (cache-aware, client/prefix_index.py) against `least-loaded`;
- two servers (one replica each) behind `vllm-router`: `--policy cache_aware` against
  `round_robin`.

A fifth run gives the ceiling: one server with one replica (with the KV memory of both),
where every turn finds its conversation's history in the one cache. No routing over two
replicas can beat its hit rate (block granularity and the new question's tokens are never
cached), so the ceiling over least-loaded's hit rate is the most any router can gain on this
workload.

Per set-up: the prefix-cache hit rate (the prompt tokens the servers found cached, from each
response's `usage.prompt_tokens_details.cached_tokens`, over all prompt tokens), requests and
output tokens per second, and the median end-to-end latency of a turn. The goal (issue 32):
prefix routing at least 1.5x least-loaded's hit rate, with no throughput loss.

    python bench/scale_out/scale.py                  # the default model, 16 conversations
    python bench/scale_out/scale.py --conversations 8 --turns 3 --out bench/results/scale.md
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

ROUTER = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
SYSTEM = (
    "You are the support assistant of a company that rents bicycles in a large city. "
    "You answer in two short sentences, politely, and you never invent prices. "
)
TOPICS = (
    "a flat tyre", "a lost key", "a late return", "a child seat", "an electric bike",
    "a helmet", "a broken bell", "a group booking", "a refund", "a longer rental",
    "a night ride", "rain", "a locked wheel", "a wrong invoice", "a station closed", "a gift card",
)  # fmt: skip


BASELINES = ("least-loaded", "round_robin")
"""The cache-blind policies each set-up's routing is compared with (its label's end)."""


@dataclass
class Result:
    label: str
    requests: int
    errors: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    seconds: float
    latencies: list[float]

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for a server")
        time.sleep(0.2)


@contextmanager
def serve(*args: str, threads: int) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "TRIO_LLM_NUM_THREADS": str(threads)}
    log = open(f"/tmp/scale-server-{port}.log", "w")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [sys.executable, "-m", "trio_llm", "serve", *args, "--port", str(port),
         "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(process, url), 1200)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def _up(process: subprocess.Popen[bytes], url: str) -> bool:
    if process.poll() is not None:
        raise RuntimeError(f"the server exited ({process.returncode}); see its log in /tmp")
    return httpx.get(url + "/health", timeout=10).status_code == 200


@contextmanager
def route(policy: str, workers: list[str]) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [ROUTER, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
         "--prometheus-port", str(free_port()), "--log-level", "warning",
         "--worker-urls", *workers],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(url + "/v1/models", timeout=5).status_code == 200, 120)
        yield url
    finally:
        process.terminate()
        process.wait(30)


async def converse(
    client: httpx.AsyncClient,
    model: str,
    topic: str,
    args: argparse.Namespace,
    result: Result,
    seed: int,
    seats: trio.Semaphore,
) -> None:
    """One user's conversation: a question, the answer, a pause to read and type (think
    time), the next question with the whole history. A turn holds one of the `seats` (the
    load's concurrency) only while it waits for its answer, so turns of different users
    interleave as they would, instead of each user holding a seat for the whole chat (which
    would hand a user's next turn the very slot its last one freed, whatever the routing)."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(args.turns):
        detail = " ".join(rng.choice(SYSTEM.split()) for _ in range(args.question_words))
        messages.append({"role": "user", "content": f"Turn {turn}: about {topic}. {detail}?"})
        await trio.sleep(rng.uniform(0, 2 * args.think_time))
        async with seats:
            started = time.perf_counter()
            reply = await client.post(
                "/v1/chat/completions",
                json={"model": model, "messages": messages, "max_tokens": args.answer_tokens,
                      "temperature": 0, "ignore_eos": True},
            )  # fmt: skip
        result.requests += 1
        if reply.status_code != 200:
            result.errors += 1
            return
        body = reply.json()
        result.latencies.append(time.perf_counter() - started)
        usage = body["usage"]
        result.prompt_tokens += usage["prompt_tokens"]
        result.cached_tokens += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        result.output_tokens += usage["completion_tokens"]
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})


async def workload(url: str, model: str, label: str, args: argparse.Namespace) -> Result:
    result = Result(label, 0, 0, 0, 0, 0, 0.0, [])
    seats = trio.Semaphore(args.concurrency)

    async def one(index: int) -> None:
        topic = TOPICS[index % len(TOPICS)]
        await converse(client, model, topic, args, result, index, seats)

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client, trio.open_nursery() as n:
        for index in range(args.conversations):
            n.start_soon(one, index)
    result.seconds = time.perf_counter() - started
    return result


def table(results: list[Result]) -> str:
    base = {r.label.split(":")[0]: r for r in results if r.label.endswith(BASELINES)}
    lines = [
        "| set-up | requests (errors) | prefix-cache hit rate | vs baseline | req/s | output tok/s "
        "| vs baseline | turn latency p50 (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        b = base[r.label.split(":")[0]]
        hit_ratio = r.hit_rate / b.hit_rate if b.hit_rate else float("nan")
        tput = (r.output_tokens / r.seconds) / (b.output_tokens / b.seconds)
        lines.append(
            f"| {r.label} | {r.requests} ({r.errors}) | {r.hit_rate:.1%} | {hit_ratio:.2f}x "
            f"| {r.requests / r.seconds:.2f} | {r.output_tokens / r.seconds:.1f} | {tput:.2f}x "
            f"| {statistics.median(r.latencies):.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--question-words", type=int, default=60)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument(
        "--think-time", type=float, default=1.0, help="mean seconds between a user's turns"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "scale.md")
    args = parser.parse_args()
    if not Path(ROUTER).exists():
        sys.exit("vllm-router is not installed: pip install vllm-router (the test extra has it)")
    name = Path(args.model).name if "/" in args.model else args.model
    common = ["--dtype", args.dtype, "--kv-cache-memory", "256MiB", "--max-model-len", "4096"]
    results: list[Result] = []
    for routing in ("least-loaded", "prefix"):
        with serve(args.model, "--data-parallel-size", "2", "--data-parallel-routing", routing,
                   *common, threads=args.threads) as url:  # fmt: skip
            results.append(
                trio.run(workload, url, name, f"one server, 2 replicas: {routing}", args)
            )
            print(table_row(results[-1]), flush=True)
    # The two replicas' KV memory in one, so that the ceiling evicts no more than they do.
    with serve(args.model, *common, "--kv-cache-memory", "512MiB", threads=args.threads) as url:
        ceiling = trio.run(workload, url, name, "one server, 1 replica: the ceiling", args)
        print(table_row(ceiling), flush=True)
    for policy in ("round_robin", "cache_aware"):
        # Fresh servers per policy: the second would otherwise find the first's conversations.
        with ExitStack() as stack:
            workers = [stack.enter_context(serve(args.model, *common, threads=args.threads))
                       for _ in range(2)]  # fmt: skip
            with route(policy, workers) as url:
                label = f"two servers behind vllm-router: {policy}"
                results.append(trio.run(workload, url, name, label, args))
                print(table_row(results[-1]), flush=True)
    report = "\n".join([
        "# Routing for prefix reuse: multi-turn chats on two replicas",
        "",
        f"Command: `{hostinfo.command()}`",
        "",
        f"Machine: {hostinfo.describe()}; load average before: {os.getloadavg()[0]:.1f}.",
        f"Model {args.model} ({args.dtype}), {args.threads} torch thread(s) per engine; "
        f"{args.conversations} conversations of {args.turns} turns, "
        f"a shared system prompt of about 35 tokens, questions of {args.question_words} words, "
        f"{args.answer_tokens} output tokens per turn, greedy, a think time of "
        f"0-{2 * args.think_time:g} s between a user's turns (all users at once, at most "
        f"{args.concurrency} turns in flight).",
        "",
        table(results),
        "",
        ceiling_line(ceiling, results),
        "",
    ])  # fmt: skip
    args.out.write_text(report)
    print(report)


def ceiling_line(ceiling: Result, results: list[Result]) -> str:
    """What the workload allows: the one-cache hit rate, and its ratio to each baseline's."""
    baselines = [r for r in results if r.label.endswith(BASELINES)]
    ratios = ", ".join(
        f"{ceiling.hit_rate / r.hit_rate:.2f}x {r.label.split(': ')[1]}" for r in baselines
    )
    return (
        f"Ceiling: one replica (every turn meets its history in the one cache) hits "
        f"{ceiling.hit_rate:.1%} of prompt tokens, so no routing over two replicas can beat "
        f"{ratios} on this workload."
    )


def table_row(result: Result) -> str:
    return (
        f"{result.label}: hit rate {result.hit_rate:.1%}, "
        f"{result.output_tokens / result.seconds:.1f} tok/s, {result.errors} errors"
    )


if __name__ == "__main__":
    main()
