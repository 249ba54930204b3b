"""Reranking side by side, in one run: 100 documents of mixed length against each of a few
queries, by sentence-transformers offline, trio-llm's engine offline and trio-llm over HTTP
(/rerank, 8 requests in flight), for two kinds of model:

- a cross-encoder: BERT with MiniLM-L6's shape and weights (all-MiniLM-L6-v2's encoder, the
  backbone of cross-encoder/ms-marco-MiniLM-L6-v2) and a one-label head (random: the time is
  the encoder's), built here; `CrossEncoder.predict` (batch 32) against `LLM.score` and
  /rerank. Pairs longer than 512 tokens are cut to 512 by all three.
- the bi-encoder all-MiniLM-L6-v2: `encode` (batch 32) and the cosine, against the same.

Every system gets the same torch thread count. The systems run in rounds, in a rotated order
each round, so whatever else the machine does falls on all alike; every run records the load
average before it. The HTTP load generator runs in this process, on the same cores.

    python bench/apis/rerank.py --threads 1 --rounds 3 --queries 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
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

EMBED = "all-MiniLM-L6-v2"
CONCURRENCY = 8
DOCUMENTS = 100

Rerank = Callable[[list[str], list[str]], list[np.ndarray]]
"""Queries and documents -> each query's score of every document."""


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def build_cross_encoder(path: Path) -> Path:
    """all-MiniLM-L6-v2's encoder under a one-label sequence-classification head."""
    import torch
    from transformers import BertForSequenceClassification

    from trio_llm.model_files import load_tokenizer, resolve_model

    source = resolve_model(EMBED)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(source.path, num_labels=1).eval()
    model.config.architectures = ["BertForSequenceClassification"]
    model.save_pretrained(path)
    load_tokenizer(source).save_pretrained(path)
    return path


def st_cross_encoder(path: Path) -> Rerank:
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(path), device="cpu", max_length=512)

    def run(queries: list[str], documents: list[str]) -> list[np.ndarray]:
        return [
            model.predict([(q, d) for d in documents], batch_size=32, show_progress_bar=False)
            for q in queries
        ]

    return run


def st_bi_encoder() -> Rerank:
    from sentence_transformers import SentenceTransformer

    from trio_llm.model_files import resolve_model

    model = SentenceTransformer(str(resolve_model(EMBED).path), device="cpu")

    def run(queries: list[str], documents: list[str]) -> list[np.ndarray]:
        out = []
        for q in queries:
            vectors = model.encode([q, *documents], batch_size=32, convert_to_numpy=True)
            norms = np.linalg.norm(vectors, axis=1)
            out.append(vectors[1:] @ vectors[0] / (norms[1:] * norms[0]))
        return out

    return run


def engine(llm: object) -> Rerank:
    def run(queries: list[str], documents: list[str]) -> list[np.ndarray]:
        return [
            np.array(
                [
                    o.outputs.score
                    for o in llm.score(q, documents, truncate_prompt_tokens=-1)  # type: ignore[attr-defined]
                ]
            )
            for q in queries
        ]

    return run


def http(url: str, model: str) -> Rerank:
    def run(queries: list[str], documents: list[str]) -> list[np.ndarray]:
        return trio.run(_http, url, model, queries, documents)

    return run


async def _http(url: str, model: str, queries: list[str], documents: list[str]) -> list[np.ndarray]:
    results: list[np.ndarray] = [np.empty(0)] * len(queries)
    todo = iter(range(len(queries)))
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            for i in todo:
                body = {
                    "model": model,
                    "query": queries[i],
                    "documents": documents,
                    "return_documents": False,
                    "truncate_prompt_tokens": -1,
                }
                response = await client.post("/rerank", json=body)
                response.raise_for_status()
                scores = np.empty(len(documents))
                for r in response.json()["results"]:
                    scores[r["index"]] = r["relevance_score"]
                results[i] = scores

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
    return results


def measure(
    title: str, systems: dict[str, Rerank], queries: list[str], docs: list[str], rounds: int
) -> None:
    names = list(systems)
    reference = systems[names[0]](queries[:1], docs)[0]
    for name in names:  # warm-up, and the scores agree
        got = systems[name](queries[:1], docs)[0]
        same = np.argsort(-got, kind="stable")[:10].tolist() == (
            np.argsort(-reference, kind="stable")[:10].tolist()
        )
        print(
            f"# warm-up {name}: max |score - sentence-transformers'| "
            f"{np.abs(got - reference).max():.2e}, same top 10: {same}"
        )
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            load = load_average()
            start = time.perf_counter()
            systems[name](queries, docs)
            elapsed = time.perf_counter() - start
            times[name].append(elapsed)
            print(f"round {r + 1} {name}: {elapsed:.2f} s (load {load:.2f})", flush=True)
    base = statistics.median(times[names[0]])
    print(f"\n### {title}\n")
    print("| system | median s | reranks/s | documents/s | vs sentence-transformers | runs (s) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        median = statistics.median(times[name])
        runs = ", ".join(f"{t:.1f}" for t in times[name])
        print(
            f"| {name} | {median:.2f} | {len(queries) / median:.2f} | "
            f"{len(queries) * len(docs) / median:.0f} | {base / median:.2f}x | {runs} |"
        )
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every system")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=8, help="reranks per run")
    parser.add_argument("--only", choices=["cross", "bi"], default=None)
    args = parser.parse_args()

    import torch

    import trio_llm
    from trio_llm.model_files import load_tokenizer, resolve_model

    torch.set_num_threads(args.threads)
    docs = sentences(DOCUMENTS, seed=29)
    queries = [q.rstrip(".?") + "?" for q in sentences(200, seed=31) if len(q.split()) <= 12]
    queries = queries[: args.queries]
    tokenizer = load_tokenizer(resolve_model(EMBED))
    pairs = [
        len(tokenizer(queries[0], d, truncation=True, max_length=512)["input_ids"]) for d in docs
    ]
    alone = [len(tokenizer(d, truncation=True, max_length=256)["input_ids"]) for d in docs]
    print(f"# {hostinfo.describe()}")
    print(
        f"# {len(queries)} queries x {len(docs)} documents; a query's pairs: {sum(pairs)} tokens "
        f"(min {min(pairs)}, median {int(statistics.median(pairs))}, max {max(pairs)}); the "
        f"documents alone (bi-encoder, cut to 256): {sum(alone)} tokens; float32, "
        f"{args.threads} threads, {args.rounds} rounds, HTTP c={CONCURRENCY}"
    )
    threads = ["--num-threads", str(args.threads)]
    with tempfile.TemporaryDirectory() as tmp:
        cross = build_cross_encoder(Path(tmp) / "minilm-ce")
        if args.only in (None, "cross"):
            with (
                trio_llm.LLM(str(cross), dtype="float32", num_threads=args.threads) as llm,
                run_server(f"{cross}:name=ce,dtype=float32", *threads) as server,
            ):
                systems = {
                    "sentence-transformers CrossEncoder.predict (batch 32)": st_cross_encoder(
                        cross
                    ),
                    "trio-llm engine offline (LLM.score)": engine(llm),
                    f"trio-llm HTTP /rerank (c={CONCURRENCY})": http(server.url, "ce"),
                }
                measure("Cross-encoder (MiniLM-L6, 512)", systems, queries, docs, args.rounds)
        if args.only in (None, "bi"):
            with (
                trio_llm.LLM(EMBED, dtype="float32", num_threads=args.threads) as llm,
                run_server(f"{EMBED}:dtype=float32", *threads) as server,
            ):
                systems = {
                    "sentence-transformers encode (batch 32) + cosine": st_bi_encoder(),
                    "trio-llm engine offline (LLM.score)": engine(llm),
                    f"trio-llm HTTP /rerank (c={CONCURRENCY})": http(server.url, EMBED),
                }
                measure("Bi-encoder (all-MiniLM-L6-v2)", systems, queries, docs, args.rounds)


if __name__ == "__main__":
    main()
