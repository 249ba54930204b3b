"""Embeddings side by side, in one run: sentence-transformers' `encode` (batch 32) offline,
trio-llm's engine offline (`LLM.embed`, every input in one call), and trio-llm over HTTP
(`/v1/embeddings`, one input per request, 32 requests in flight, base64 as the OpenAI SDK asks),
on all-MiniLM-L6-v2 in float32 with the same torch thread count, on a corpus of mixed lengths
(tests/embedding_corpus.py: mostly short, some paragraphs, a few past the model's 256 tokens,
which every system truncates to 256).

The three run in rounds, in a rotated order each round, so that whatever else the machine does
falls on all of them alike; every run records the load average (`/proc/loadavg`) before it.
The HTTP load generator runs in this process, on the same cores as the server.

    python bench/apis/embed.py --threads 2 --rounds 3 --count 512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import trio

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it
sys.path.insert(0, str(BENCH.parent / "tests"))  # the corpus and the server process the tests use

import hostinfo  # noqa: E402
from embedding_corpus import sentences  # noqa: E402
from http_server_process import run_server  # noqa: E402

MODEL = "all-MiniLM-L6-v2"
CONCURRENCY = 32


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def sentence_transformers_run(threads: int) -> Callable[[list[str]], np.ndarray]:
    import torch
    from sentence_transformers import SentenceTransformer

    from trio_llm.model_files import resolve_model

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(resolve_model(MODEL).path), device="cpu")

    def run(corpus: list[str]) -> np.ndarray:
        return model.encode(corpus, batch_size=32, convert_to_numpy=True)

    return run


def engine_run(llm: object) -> Callable[[list[str]], np.ndarray]:
    def run(corpus: list[str]) -> np.ndarray:
        outputs = llm.embed(corpus, truncate_prompt_tokens=-1)  # type: ignore[attr-defined]
        return np.stack([o.outputs.data for o in outputs])

    return run


def http_run(url: str) -> Callable[[list[str]], np.ndarray]:
    def run(corpus: list[str]) -> np.ndarray:
        return trio.run(_http, url, corpus)

    return run


async def _http(url: str, corpus: list[str]) -> np.ndarray:
    import base64

    results: list[np.ndarray | None] = [None] * len(corpus)
    todo = iter(range(len(corpus)))
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            for i in todo:
                body = {
                    "model": MODEL,
                    "input": corpus[i],
                    "encoding_format": "base64",
                    "truncate_prompt_tokens": -1,
                }
                response = await client.post("/v1/embeddings", json=body)
                response.raise_for_status()
                data = response.json()["data"][0]["embedding"]
                results[i] = np.frombuffer(base64.b64decode(data), dtype="<f4")

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
    return np.stack(results)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every system")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=512, help="sentences in the corpus")
    args = parser.parse_args()

    import trio_llm
    from trio_llm.model_files import load_tokenizer, resolve_model

    corpus = sentences(args.count, seed=7)
    tokenizer = load_tokenizer(resolve_model(MODEL))
    lengths = [len(tokenizer.encode(s, truncation=True, max_length=256)) for s in corpus]
    tokens = sum(lengths)
    print(f"# {hostinfo.describe()}")
    print(
        f"# corpus: {len(corpus)} sentences, {tokens} tokens (min {min(lengths)}, median "
        f"{int(statistics.median(lengths))}, max {max(lengths)}); float32, {args.threads} "
        f"threads, {args.rounds} rounds"
    )
    with (
        trio_llm.LLM(MODEL, dtype="float32", num_threads=args.threads) as llm,
        run_server(f"{MODEL}:dtype=float32", "--num-threads", str(args.threads)) as server,
    ):
        systems = {
            "sentence-transformers encode (batch 32)": sentence_transformers_run(args.threads),
            "trio-llm engine offline (LLM.embed)": engine_run(llm),
            f"trio-llm HTTP /v1/embeddings (c={CONCURRENCY})": http_run(server.url),
        }
        names = list(systems)
        reference = systems[names[0]](corpus[:64])
        for name in names:  # warm-up, and the outputs agree
            got = systems[name](corpus[:64])
            cosine = (got * reference).sum(1)
            print(f"# warm-up {name}: min cosine to sentence-transformers {cosine.min():.6f}")
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                load = load_average()
                start = time.perf_counter()
                systems[name](corpus)
                elapsed = time.perf_counter() - start
                times[name].append(elapsed)
                print(f"round {r + 1} {name}: {elapsed:.2f} s (load {load:.2f})", flush=True)
    base = statistics.median(times[names[0]])
    print()
    print("| system | median s | inputs/s | tokens/s | vs sentence-transformers | runs (s) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        median = statistics.median(times[name])
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(
            f"| {name} | {median:.2f} | {len(corpus) / median:.1f} | {tokens / median:.0f} | "
            f"{base / median:.2f}x | {runs} |"
        )


if __name__ == "__main__":
    main()
