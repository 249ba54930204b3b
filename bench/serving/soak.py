"""Soak: minutes of mixed traffic against a real `trio-llm serve`, then what it leaked (not in CI).

    python bench/serving/soak.py              # 10 minutes, concurrency 16, the default model
    python bench/serving/soak.py --minutes 3 --model /path/to/hf-dir

It starts the server itself (so it can read the server's and the engine's /proc), runs a
warm-up, lets the server go idle and takes a baseline, then runs the soak proper: `concurrency`
clients, each looping over a weighted mix of
- streaming requests (chat or completions, over HTTP/1.1 or HTTP/2), read to `[DONE]`;
- non-streaming requests;
- n=2 requests, streaming or not;
- hang-ups: clients that disconnect before the response headers, after the first chunk,
  mid-stream, or while waiting for a non-streaming response, over HTTP/1.1 or as HTTP/2
  streams (RST_STREAM, or the whole connection closed);
- bad inputs: hostile bodies from tests/fuzz_bodies.py (wrong types, huge numbers, invalid
  UTF-8, lone surrogates, deep nesting, empty and enormous message lists, arbitrary JSON).
Then it waits for the server to go idle again and compares.

An unexpected error is anything a correct server would not do: a 5xx, a 503 to a normal
request (the server queues 512 sequences beyond the 2 x concurrency it runs, so only leaked
admissions could fill it; a bad input that is a valid request for more sequences than are free
may get one), an error event in a stream, a malformed stream, a transport error on a request
that did not hang up, an error body that is not OpenAI's shape. The checks: zero unexpected
errors, server RSS growth under 5% from the idle baseline after warm-up to the idle end, no
more fds in either process than at the baseline, no new /dev/shm entries, the engine never
restarted, and the engine idle with every KV block free at the end. The figures go to
bench/results/reliability.md (or --output), and the exit status is 1 if a check failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))  # the servers, clients and bodies the tests use

import hostinfo  # noqa: E402
from fuzz_bodies import base_bodies, mutated_bodies, spliced_bodies  # noqa: E402
from http_clients import http1_request, http2_requests, random_hang_up, sse_payloads  # noqa: E402
from http_server_process import (  # noqa: E402
    ServerProcess,
    dev_shm,
    dev_shm_used,
    fd_targets,
    rss_kib,
    run_server,
)

KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "soak"
MIX = {"stream": 35, "plain": 20, "n2": 10, "hang_up": 20, "bad_input": 15}
PROMPTS = [
    "Tell me about rivers.",
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "List three colors.",
    "Explain what a computer does, in one sentence.",
    "Once upon a time",
    "The best way to learn is",
]


@dataclass
class Tally:
    served: collections.Counter[str] = field(default_factory=collections.Counter)
    hang_ups: collections.Counter[str] = field(default_factory=collections.Counter)
    bad_inputs: collections.Counter[int] = field(default_factory=collections.Counter)
    unexpected: list[str] = field(default_factory=list)
    tokens: int = 0

    def error(self, what: str) -> None:
        self.unexpected.append(what[:300])


@dataclass
class Snapshot:
    server_rss_kib: int
    engine_rss_kib: int
    server_fds: int
    engine_fds: int
    memfds: int
    shm: set[str]
    """Everything in /dev/shm (the machine's, not only ours)."""
    shm_used: set[str]
    """What the server or the engine holds or maps in /dev/shm."""
    engine_pid: int
    metrics: dict[str, float]


def snapshot(server: ServerProcess) -> Snapshot:
    metrics = server.wait_idle(60.0)
    time.sleep(1.0)  # connections the clients closed last are closed on the server's side too
    engine = server.engine_pid()
    fds = fd_targets(server.process.pid)
    return Snapshot(
        server_rss_kib=rss_kib(server.process.pid),
        engine_rss_kib=rss_kib(engine),
        server_fds=len(fds),
        engine_fds=len(fd_targets(engine)),
        memfds=sum(1 for t in fds if t.startswith("/memfd:")),
        shm=dev_shm(),
        shm_used=dev_shm_used(server.process.pid) | dev_shm_used(engine),
        engine_pid=engine,
        metrics=metrics,
    )


def draw(strategy, count: int) -> list:  # type: ignore[no-untyped-def]
    """`count` examples of a hypothesis strategy, reproducibly, outside a test."""
    from hypothesis import HealthCheck, Phase, given, settings

    found: list = []

    @settings(
        max_examples=count,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(strategy)
    def collect(example) -> None:  # type: ignore[no-untyped-def]
        found.append(example)

    collect()
    return found


def bounded(body: dict) -> dict:
    """A mutated body may turn out valid; it must not then generate for minutes (a valid
    max_tokens of 1000 on 16 busy streams outlasts any client timeout)."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key, 0)
        if value is None or (type(value) is int and value > 16):
            body[key] = 16
    return body


def bad_inputs(per_route: int) -> list[tuple[str, bytes]]:
    pool = []
    for route, base in base_bodies(MODEL).items():
        unchanged = {**base, "max_tokens": 2}
        mutated = [bounded(b) for b in draw(mutated_bodies(base), per_route) if b != unchanged]
        pool += [(route, json.dumps(body).encode()) for body in mutated]
        pool += [(route, raw) for raw in draw(spliced_bodies(base, enormous=20_000), per_route)]
    return pool


class Client:
    def __init__(
        self,
        server: ServerProcess,
        h1: httpx.AsyncClient,
        h2: httpx.AsyncClient,
        tally: Tally,
        bad: list[tuple[str, bytes]],
        rng: random.Random,
    ) -> None:
        self.server = server
        self.h1, self.h2 = h1, h2
        self.tally = tally
        self.bad = bad
        self.rng = rng
        host, port = server.url.removeprefix("http://").split(":")
        self.address = (host, int(port))

    def body(self, *, stream: bool, n: int = 1) -> tuple[str, dict]:
        rng = self.rng
        fields: dict[str, object] = {
            "model": MODEL,
            "max_tokens": rng.randint(4, 48),
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "stream": stream,
            "n": n,
        }
        if rng.random() < 0.3:
            fields["seed"] = rng.randrange(1000)
        if stream and rng.random() < 0.5:
            fields["stream_options"] = {"include_usage": True}
        prompt = rng.choice(PROMPTS)
        if rng.random() < 0.5:
            messages = [{"role": "user", "content": prompt}]
            return "/v1/chat/completions", {**fields, "messages": messages}
        return "/v1/completions", {**fields, "prompt": prompt}

    async def run(self, deadline: float) -> None:
        kinds, weights = zip(*MIX.items(), strict=True)
        while trio.current_time() < deadline:
            kind = self.rng.choices(kinds, weights)[0]
            try:
                await getattr(self, kind)()
            except (httpx.HTTPError, OSError, AssertionError, ValueError, KeyError) as error:
                self.tally.error(f"{kind}: {type(error).__name__}: {error}")

    def client(self) -> httpx.AsyncClient:
        return self.h2 if self.rng.random() < 0.3 else self.h1

    async def stream(self, n: int = 1) -> None:
        path, body = self.body(stream=True, n=n)
        c = self.client()
        async with c.stream("POST", path, json=body) as response:
            text = (await response.aread()).decode()
        if response.status_code != 200:
            self.tally.error(f"stream: {response.status_code} {text[:200]}")
            return
        events = sse_payloads(text)
        assert events[-1] == "[DONE]", events[-3:]
        chunks = [json.loads(e) for e in events[:-1]]
        errors = [c for c in chunks if "error" in c]
        if errors:
            self.tally.error(f"stream: error event {errors[0]}")
            return
        finished = {
            ch["index"] for c in chunks for ch in c.get("choices", []) if ch.get("finish_reason")
        }
        assert finished == set(range(n)), (finished, n)
        self.tally.served["stream" if n == 1 else "n2 stream"] += 1
        self.tally.tokens += sum(len(c.get("choices", [])) for c in chunks)

    async def plain(self, n: int = 1) -> None:
        path, body = self.body(stream=False, n=n)
        response = await self.client().post(path, json=body)
        if response.status_code != 200:
            self.tally.error(f"plain: {response.status_code} {response.text[:200]}")
            return
        reply = response.json()
        assert [c["index"] for c in reply["choices"]] == list(range(n))
        assert all(c["finish_reason"] in ("stop", "length") for c in reply["choices"])
        self.tally.served["plain" if n == 1 else "n2 plain"] += 1
        self.tally.tokens += reply["usage"]["completion_tokens"]

    async def n2(self) -> None:
        await (self.stream(n=2) if self.rng.random() < 0.5 else self.plain(n=2))

    async def hang_up(self) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            hang_up = random_hang_up(rng)
            stream = hang_up.mode in ("first_chunk", "mid_stream") or rng.random() < 0.5
            path, body = self.body(stream=stream)
            body["max_tokens"] = 200
            await http1_request(self.address, path, body, AUTH, hang_up)
            self.tally.hang_ups[f"HTTP/1.1 {hang_up.mode}"] += 1
            return
        requests = []
        for _ in range(rng.randint(1, 3)):
            hang_up = random_hang_up(rng)
            stream = hang_up.mode in ("first_chunk", "mid_stream") or rng.random() < 0.5
            path, body = self.body(stream=stream)
            body["max_tokens"] = 200
            requests.append((path, body, hang_up))
        close = rng.random() < 0.3
        await http2_requests(self.address, requests, AUTH, close_connection=close)
        how = "connection closed" if close else "RST_STREAM"
        for _, _, hang_up in requests:
            self.tally.hang_ups[f"HTTP/2 {hang_up.mode} ({how})"] += 1

    async def bad_input(self) -> None:
        route, raw = self.rng.choice(self.bad)
        response = await self.h1.post(
            route, content=raw, headers={"Content-Type": "application/json"}, timeout=300
        )
        self.tally.bad_inputs[response.status_code] += 1
        if response.status_code == 503 and "retry-after" in response.headers:
            return  # a valid body asking for more sequences than are free: overload
        if response.status_code >= 500:
            self.tally.error(f"bad input got {response.status_code}: {raw[:120]!r}")
        elif response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, error


async def traffic(
    server: ServerProcess,
    seconds: float,
    concurrency: int,
    tally: Tally,
    bad: list[tuple[str, bytes]],
    seed: int,
) -> None:
    deadline = trio.current_time() + seconds
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with (
        httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=120, limits=limits) as h1,
        httpx.AsyncClient(
            base_url=server.url, headers=AUTH, timeout=120, limits=limits, http1=False, http2=True
        ) as h2,
        trio.open_nursery() as nursery,
    ):
        for i in range(concurrency):
            client = Client(server, h1, h2, tally, bad, random.Random(seed * 1000 + i))
            nursery.start_soon(client.run, deadline)


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def growth(before: int, after: int) -> str:
    return f"{(after - before) / before * 100:+.1f}%"


def report(
    args: argparse.Namespace,
    warm: Tally,
    tally: Tally,
    before: Snapshot,
    after: Snapshot,
    seconds: float,
    checks: list[tuple[str, bool]],
    server_line: str,
) -> str:
    import torch

    served = sum(tally.served.values())
    hang_ups = sum(tally.hang_ups.values())
    bad = sum(tally.bad_inputs.values())
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cpu = hostinfo.cpu_name()
    lines = [
        "# Reliability soak",
        "",
        f"Command: `{hostinfo.command()}`. What it does and what counts as an unexpected "
        "error: the docstring of bench/serving/soak.py.",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- CPU: {cpu}, {os.cpu_count()} cores visible; kernel {platform.release()}",
        f"- load average at the end: {load} (the machine is shared with other work)",
        f"- Python {platform.python_version()}, torch {torch.__version__}",
        f"- server: {server_line}",
        f"- soak proper: {seconds / 60:.1f} minutes at concurrency {args.concurrency}, after a "
        f"{args.warmup:.0f} s warm-up ({sum(warm.served.values())} requests, not counted)"
        + ("" if args.minutes >= 10 else "; shorter than the 10 minutes issue 8 asks for"),
        "",
        "## Checks",
        "",
        "| check | result |",
        "|---|---|",
        *(f"| {name} | {'pass' if ok else '**FAIL**'} |" for name, ok in checks),
        "",
        "## Traffic",
        "",
        "| | count |",
        "|---|---:|",
        f"| requests served to completion | {served} |",
        *(f"| - {kind} | {count} |" for kind, count in sorted(tally.served.items())),
        f"| completion tokens (or chunks) received | {tally.tokens} |",
        f"| faults injected (hang-ups), all survived | {hang_ups} |",
        *(f"| - {kind} | {count} |" for kind, count in sorted(tally.hang_ups.items())),
        f"| bad inputs tried (some hostile bodies turn out valid: those are served) | {bad} |",
        *(
            f"| - answered {status} | {count} |"
            for status, count in sorted(tally.bad_inputs.items())
        ),
        f"| unexpected errors | {len(tally.unexpected)} |",
        "",
        "## Memory and descriptors (idle after warm-up -> idle at the end)",
        "",
        "| | before | after | change |",
        "|---|---:|---:|---:|",
        f"| server RSS | {mib(before.server_rss_kib)} | {mib(after.server_rss_kib)} | "
        f"{growth(before.server_rss_kib, after.server_rss_kib)} |",
        f"| engine RSS | {mib(before.engine_rss_kib)} | {mib(after.engine_rss_kib)} | "
        f"{growth(before.engine_rss_kib, after.engine_rss_kib)} |",
        f"| server fds | {before.server_fds} | {after.server_fds} | "
        f"{after.server_fds - before.server_fds:+d} |",
        f"| engine fds | {before.engine_fds} | {after.engine_fds} | "
        f"{after.engine_fds - before.engine_fds:+d} |",
        f"| ring memfds held by the server | {before.memfds} | {after.memfds} | "
        f"{after.memfds - before.memfds:+d} |",
        f"| /dev/shm entries held or mapped by the server or engine | {len(before.shm_used)} | "
        f"{len(after.shm_used)} | {len(after.shm_used) - len(before.shm_used):+d} |",
        f"| /dev/shm entries, whole machine | {len(before.shm)} | {len(after.shm)} | "
        f"{len(after.shm) - len(before.shm):+d} |",
        f"| KV blocks free | {after.metrics['trio_llm_kv_cache_free_blocks']:.0f} of "
        f"{after.metrics['trio_llm_kv_cache_total_blocks']:.0f} | | |",
        "",
    ]
    if tally.unexpected:
        lines += ["## First unexpected errors", "", *(f"- `{e}`" for e in tally.unexpected[:10])]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak proper")
    parser.add_argument("--warmup", type=float, default=60.0, help="warm-up seconds")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model", default=None, help="default: the default model")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "reliability.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print("drawing bad inputs ...", flush=True)
    bad = bad_inputs(per_route=60)
    model = [args.model] if args.model else []
    running = args.concurrency * 2  # every client at once with n=2
    with run_server(
        *model,
        "--served-model-name", MODEL,
        "--api-key", KEY,
        "--max-model-len", str(args.max_model_len),
        "--max-num-seqs", str(running),
        "--max-queued-requests", "512",
        "--shutdown-timeout", "10",
    ) as server:  # fmt: skip
        server_line = next(line for line in server.log if "serving" in line).split(": ", 1)[1]
        print(server_line.strip(), flush=True)
        warm = Tally()
        print(f"warm-up: {args.warmup:.0f} s", flush=True)
        trio.run(traffic, server, args.warmup, args.concurrency, warm, bad, args.seed)
        before = snapshot(server)
        tally = Tally()
        print(f"soak: {args.minutes:.1f} min", flush=True)
        start = time.monotonic()
        trio.run(traffic, server, args.minutes * 60, args.concurrency, tally, bad, args.seed + 1)
        seconds = time.monotonic() - start
        after = snapshot(server)
        idle = (
            after.metrics["trio_llm_num_requests_running"] == 0
            and after.metrics["trio_llm_num_requests_waiting"] == 0
            and after.metrics["trio_llm_kv_cache_free_blocks"]
            == after.metrics["trio_llm_kv_cache_total_blocks"]
        )
        checks = [
            ("zero unexpected errors", not tally.unexpected),
            (
                "server RSS growth under 5%",
                after.server_rss_kib < 1.05 * before.server_rss_kib,
            ),
            (
                "no leaked fds (server, engine)",
                after.server_fds <= before.server_fds and after.engine_fds <= before.engine_fds,
            ),
            (
                "no leaked shared memory (ring memfds, /dev/shm)",
                after.memfds == before.memfds and not after.shm_used and after.shm <= before.shm,
            ),
            ("engine never restarted", after.engine_pid == before.engine_pid),
            ("engine idle, every KV block free", idle),
        ]
    text = report(args, warm, tally, before, after, seconds, checks, server_line.strip())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
