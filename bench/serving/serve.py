"""Load generator for any OpenAI-compatible server: streaming chat or completions (`--endpoint`,
one module per endpoint in bench/serving/endpoints/).

    python bench/serving/serve.py --base-url http://127.0.0.1:8000 --concurrency 1 8 32

Closed loop (`--concurrency 1 8 32`: that many clients, each sending its next request when the
last one finishes) or open loop (`--request-rate R`: Poisson arrivals). Per run it reports
request throughput, output tokens/s, TTFT, inter-token latency, TPOT and end-to-end latency
percentiles and errors, as JSON and a markdown table; `--plot` draws output tokens/s and TTFT
p99 against concurrency, one line per `--label`.

Prompts are `--input-len` random common words after an instruction that draws a long answer, so
a server that ignores `ignore_eos` still tends to run to `max_tokens`; each concurrency level
draws its own prompts (no prefix cache carries over from the level before), and an untimed
warm-up request with a prompt of its own precedes each level. With `--concurrency`, the number
of requests per level is `--num-prompts` if given, else max(--min-prompts,
--prompts-per-client x concurrency), so every client sends a few requests.

Output tokens are counted from the server's `usage` (requested with
`stream_options.include_usage`) when it reports one, else from the number of content chunks
(column "usage" says which). Inter-token latency is measured between content-bearing chunks, so a
server that batches several tokens per chunk shows larger but fewer gaps. The load generator
shares the machine with the server: its own CPU time per run is reported ("client CPU", in cores).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import trio

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402
from serving.endpoints import ENDPOINTS  # noqa: E402  (one module per endpoint)

# Common words that are one token each in most BPE vocabularies.
_WORD_TEXT = """
time person year way day thing man world life hand part child eye woman place work week case
point government company number group problem fact river mountain city garden music story
letter window table paper water light sound color history science market
"""
WORDS = tuple(_WORD_TEXT.split())


@dataclass
class RequestResult:
    ok: bool
    ttft: float = math.nan
    e2e: float = math.nan
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    usage_reported: bool = False
    error: str = ""


@dataclass
class RunSummary:
    label: str
    concurrency: int | None
    request_rate: float | None
    num_requests: int
    errors: int
    duration_s: float
    request_throughput: float
    output_tokens_per_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    tpot_p50: float
    e2e_p50: float
    e2e_p99: float
    usage_reported: bool = False
    """Every successful request's output tokens came from the server's `usage`."""
    client_cpu_cores: float = 0.0
    """CPU seconds the load generator spent per second of the run."""
    first_error: str = ""


def percentile(values: list[float], q: float) -> float:
    clean = sorted(v for v in values if not math.isnan(v))
    if not clean:
        return math.nan
    k = (len(clean) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return clean[lo] + (clean[hi] - clean[lo]) * (k - lo)


PROMPT_INSTRUCTION = "Write a long, detailed story that uses all of these words:"


def make_prompt(rng: random.Random, words: int) -> str:
    return PROMPT_INSTRUCTION + " " + " ".join(rng.choice(WORDS) for _ in range(words))


def prompts_for_level(args: argparse.Namespace, concurrency: int | None) -> int:
    if args.num_prompts is not None:
        return args.num_prompts
    if concurrency is None:
        return args.min_prompts
    return max(args.min_prompts, args.prompts_per_client * concurrency)


def level_prompts(
    args: argparse.Namespace, concurrency: int | None, rate: float | None = None
) -> tuple[str, list[str]]:
    """The warm-up prompt and the timed prompts of one level: the same for every server."""
    rng = random.Random(f"{args.seed}-{concurrency}-{rate}")
    warmup = make_prompt(rng, args.input_len)
    count = prompts_for_level(args, concurrency)
    return warmup, [make_prompt(rng, args.input_len) for _ in range(count)]


def request_body(args: argparse.Namespace, prompt: str) -> dict[str, object]:
    body: dict[str, object] = {
        "model": args.model,
        "max_tokens": args.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update(args.extra_body)
    body.update(ENDPOINTS[args.endpoint].prompt_fields(prompt))
    return body


async def one_request(
    client: httpx.AsyncClient, args: argparse.Namespace, prompt: str
) -> RequestResult:
    endpoint = ENDPOINTS[args.endpoint]
    result = RequestResult(ok=False)
    start = time.perf_counter()
    last = start
    chunks = 0
    try:
        payload = request_body(args, prompt)
        async with client.stream("POST", endpoint.PATH, json=payload) as response:
            if response.status_code != 200:
                body = await response.aread()
                result.error = f"HTTP {response.status_code}: {body[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])[:200]
                    return result
                if event.get("usage"):
                    result.output_tokens = event["usage"].get("completion_tokens", 0)
                    result.prompt_tokens = event["usage"].get("prompt_tokens", 0)
                    result.usage_reported = result.output_tokens > 0
                for choice in event.get("choices") or ():
                    delta = endpoint.text(choice)
                    if delta:
                        now = time.perf_counter()
                        if chunks == 0:
                            result.ttft = now - start
                        else:
                            result.itls.append(now - last)
                        last = now
                        chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
        return result
    result.e2e = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks
    result.ok = chunks > 0
    if not result.ok:
        result.error = "no content streamed"
    return result


async def run_load(
    args: argparse.Namespace, concurrency: int | None, rate: float | None
) -> tuple[list[RequestResult], float, float]:
    warmup, prompts = level_prompts(args, concurrency, rate)
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=args.base_url,
        http2=args.http2,
        http1=not args.http2,
        limits=limits,
        timeout=httpx.Timeout(args.timeout),
        headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else None,
    ) as client:
        # One untimed request warms the server (and its caches) before the clock starts.
        await one_request(client, args, warmup)
        start = time.perf_counter()
        cpu_start = time.process_time()
        if concurrency is not None:
            queue = iter(prompts)

            async def worker() -> None:
                for prompt in queue:
                    results.append(await one_request(client, args, prompt))

            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker)
        else:
            assert rate is not None
            arrivals = random.Random(args.seed)

            async def fire(prompt: str) -> None:
                results.append(await one_request(client, args, prompt))

            async with trio.open_nursery() as nursery:
                for prompt in prompts:
                    nursery.start_soon(fire, prompt)
                    await trio.sleep(arrivals.expovariate(rate))
        duration = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
    return results, duration, cpu / duration


def summarize(
    label: str,
    results: list[RequestResult],
    duration: float,
    concurrency: int | None,
    rate: float | None,
    client_cpu_cores: float = 0.0,
) -> RunSummary:
    ok = [r for r in results if r.ok]
    itls = [x for r in ok for x in r.itls]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out_tokens = sum(r.output_tokens for r in ok)
    errors = [r for r in results if not r.ok]
    ms = 1000.0
    return RunSummary(
        label=label,
        concurrency=concurrency,
        request_rate=rate,
        num_requests=len(results),
        errors=len(errors),
        duration_s=duration,
        request_throughput=len(ok) / duration,
        output_tokens_per_s=out_tokens / duration,
        mean_prompt_tokens=statistics.fmean([r.prompt_tokens for r in ok]) if ok else 0.0,
        mean_output_tokens=statistics.fmean([r.output_tokens for r in ok]) if ok else 0.0,
        ttft_p50=percentile([r.ttft for r in ok], 50) * ms,
        ttft_p90=percentile([r.ttft for r in ok], 90) * ms,
        ttft_p99=percentile([r.ttft for r in ok], 99) * ms,
        itl_p50=percentile(itls, 50) * ms,
        itl_p99=percentile(itls, 99) * ms,
        tpot_p50=percentile(tpots, 50) * ms,
        e2e_p50=percentile([r.e2e for r in ok], 50) * ms,
        e2e_p99=percentile([r.e2e for r in ok], 99) * ms,
        usage_reported=bool(ok) and all(r.usage_reported for r in ok),
        client_cpu_cores=client_cpu_cores,
        first_error=errors[0].error if errors else "",
    )


def markdown_table(rows: list[RunSummary]) -> str:
    head = (
        "| server | conc. | rate | reqs | err | req/s | out tok/s | TTFT p50 | TTFT p90 | "
        "TTFT p99 | ITL p50 | ITL p99 | TPOT p50 | E2E p50 | E2E p99 | out tok/req | usage | "
        "client CPU |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r.label} | {r.concurrency or '-'} | {r.request_rate or '-'} | {r.num_requests} | "
        f"{r.errors} | {r.request_throughput:.2f} | {r.output_tokens_per_s:.1f} | "
        f"{r.ttft_p50:.0f} ms | {r.ttft_p90:.0f} ms | {r.ttft_p99:.0f} ms | {r.itl_p50:.1f} ms | "
        f"{r.itl_p99:.1f} ms | {r.tpot_p50:.1f} ms | {r.e2e_p50:.0f} ms | {r.e2e_p99:.0f} ms | "
        f"{r.mean_output_tokens:.1f} | {'yes' if r.usage_reported else 'no'} | "
        f"{r.client_cpu_cores:.2f} |\n"
        for r in rows
    )
    return head + body


def plot(rows: list[RunSummary], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4))
    for label in dict.fromkeys(r.label for r in rows):
        mine = sorted(
            (r for r in rows if r.label == label and r.concurrency),
            key=lambda r: r.concurrency or 0,
        )
        xs = [r.concurrency for r in mine]
        ax_tps.plot(xs, [r.output_tokens_per_s for r in mine], marker="o", label=label)
        ax_ttft.plot(xs, [r.ttft_p99 / 1000 for r in mine], marker="o", label=label)
    for ax, title in ((ax_tps, "output tokens/s"), (ax_ttft, "TTFT p99 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax_tps.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--label", default="server", help="name of this server in the table and plot")
    p.add_argument("--endpoint", choices=list(ENDPOINTS), default="chat")
    p.add_argument("--concurrency", type=int, nargs="+", default=None)
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second")
    p.add_argument(
        "--num-prompts", type=int, default=None, help="requests per level (default: see below)"
    )
    p.add_argument("--prompts-per-client", type=int, default=2)
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=128, help="random words after the instruction")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens")
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--extra-body",
        type=json.loads,
        default={},
        help="JSON object merged into every request body (server-specific options)",
    )
    p.add_argument("--http2", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="append summaries to this JSON file")
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args(argv)
    if args.concurrency is None and args.request_rate is None:
        args.concurrency = [1]
    return args


async def amain(args: argparse.Namespace) -> list[RunSummary]:
    rows: list[RunSummary] = []
    for concurrency in args.concurrency or [None]:
        results, duration, cpu = await run_load(args, concurrency, args.request_rate)
        rows.append(summarize(args.label, results, duration, concurrency, args.request_rate, cpu))
        print(markdown_table(rows[-1:]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = trio.run(amain, args)
    print(f"\nMachine: {hostinfo.describe()}\n")
    print(markdown_table(rows))
    if args.json:
        existing = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(existing + [asdict(r) for r in rows], indent=1))
    if args.plot:
        plot(rows, args.plot)
    return 1 if any(r.errors for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
