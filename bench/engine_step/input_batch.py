"""A step's input preparation on this CPU: rebuilt from the sequences' Python lists (the runner
before engine/step/input_batch.py, kept here as `legacy_prepare`) against the persistent input batch
(`ModelRunner.prepare` now), side by side in one process.

For each N and context length, N sequences decode one token per step (sampled with temperature,
top-k and top-p, so the sampling arrays are built too): each step appends a token to every
sequence (and a block at each block boundary), then both paths prepare the same batch, taking
turns. Timed: the packed row's arrays and tensors, the attention metadata (the torch backend's
plans, the same work on both paths) and the sampling tensors; `inputs only` leaves the attention
metadata out (the part this change is about). Medians over --steps steps.

Usage: python bench/engine_step/input_batch.py [--ns 1,32,256] [--contexts 32,1024] [--steps 60]
       [--out bench/results/input_batch.md]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from trio_llm.engine.attention import StepLayout
from trio_llm.engine.attention.interface import as_tensor
from trio_llm.engine.attention.torch_backend import TorchAttentionMetadata
from trio_llm.engine.ops.matmul import Matmul
from trio_llm.engine.plans import invariance
from trio_llm.engine.step.input_batch import InputBatch, Staging
from trio_llm.engine.step.model_runner import ModelRunner
from trio_llm.engine.step.sampler import SamplingTensors
from trio_llm.engine.step.sequence import ScheduledBatch, Sequence
from trio_llm.sampling_params import SamplingParams

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

BLOCK = 16
VOCAB = 49152
# SmolLM2-135M's cache shape: 3 KV heads of 64.
CACHE_SHAPE = (4096, BLOCK, 3, 64)


def legacy_prepare(self: SimpleNamespace, batch: ScheduledBatch) -> tuple[object, ...]:
    """ModelRunner.prepare as it was before the persistent input batch (its arrays and
    tensors; `prompt_rows` left out, since no request here asks for prompt logprobs)."""
    seqs = batch.seqs
    num_tokens = np.asarray(batch.num_tokens, dtype=np.int64)
    starts = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, len(seqs))
    ends = starts + num_tokens
    cu = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum(num_tokens, out=cu[1:])
    ids: list[int] = []
    for s, a, b in zip(seqs, starts.tolist(), ends.tolist()):
        ids.extend(s.token_ids[a:b])
    row_seq = np.repeat(np.arange(len(seqs)), num_tokens)
    positions = np.arange(int(cu[-1]), dtype=np.int64) - cu[row_seq] + starts[row_seq]
    width = max(len(s.block_table) for s in seqs)
    tables = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        tables[i, : len(s.block_table)] = s.block_table
    bs = self.block_size
    slots = tables[row_seq, positions // bs] * bs + positions % bs
    num_all = np.fromiter((s.num_tokens for s in seqs), np.int64, len(seqs))
    samples = ends == num_all
    for s in seqs:
        if s.prompt_logprobs is not None:
            raise AssertionError("not benchmarked")
    device = self.device
    attn = self._attention.build(
        StepLayout(
            num_decodes=batch.num_decodes,
            block_tables=tables,
            cu_seqlens_q=cu,
            context_lens=ends,
            slot_mapping=slots,
            key_bucket=invariance.KEY_BUCKET if self.invariance.on else 0,
        ),
        self.k_caches[0],
    )
    index = np.flatnonzero(samples)
    st = SamplingTensors.build([seqs[i] for i in index.tolist()], frozenset(), VOCAB, device)
    return (
        torch.tensor(ids, dtype=torch.long, device=device).unsqueeze(0),
        as_tensor(positions, device).unsqueeze(0),
        attn,
        as_tensor(cu[1:][samples] - 1, device),
        st,
    )


def new_prepare(self: SimpleNamespace, batch: ScheduledBatch) -> tuple[object, ...]:
    inputs = ModelRunner.prepare(self, batch)  # type: ignore[arg-type]
    chosen = [batch.seqs[i] for i in inputs.sample_index.tolist()]
    st = SamplingTensors.build(chosen, frozenset(), VOCAB, self.device, inputs.sampling)
    return inputs, st


class _NoAttention:
    """The attention metadata left out (`inputs only`)."""

    @staticmethod
    def build(*_: object) -> None:
        return None


def runner_state(max_model_len: int, attention: object) -> SimpleNamespace:
    device = torch.device("cpu")
    return SimpleNamespace(
        block_size=BLOCK,
        device=device,
        invariance=invariance.Decision(Matmul(), False, "benchmark"),
        _attention=attention,
        k_caches=[torch.zeros(CACHE_SHAPE)],
        input_batch=InputBatch(BLOCK, max_model_len),
        staging=Staging(device),
        lora=None,  # ModelRunner.prepare reads it (LoRA off)
    )


def make_seqs(n: int, context: int, rng: random.Random) -> list[Sequence]:
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95)
    seqs = []
    for i in range(n):
        seq = Sequence(str(i), [rng.randrange(VOCAB) for _ in range(context)], params, 10_000)
        seq.block_table = rng.sample(range(CACHE_SHAPE[0]), -(-(context + 1) // BLOCK))
        seqs.append(seq)
    return seqs


def advance(seqs: list[Sequence], rng: random.Random) -> ScheduledBatch:
    """The scheduler's part of a decode step: a token sampled last step, a block when due."""
    for s in seqs:
        s.token_ids.append(rng.randrange(VOCAB))
        s.num_computed_tokens = len(s.token_ids) - 1
        if len(s.token_ids) > len(s.block_table) * BLOCK:
            s.block_table.append(rng.randrange(CACHE_SHAPE[0]))
    return ScheduledBatch(seqs=seqs, num_tokens=[1] * len(seqs), num_decodes=len(seqs))


def measure(n: int, context: int, steps: int, attention: object) -> tuple[float, float]:
    """Median milliseconds per step of (legacy, new)."""
    rng = random.Random(n * 7919 + context)
    seqs = make_seqs(n, context, rng)
    legacy_self = runner_state(context + steps + 16, attention)
    new_self = runner_state(context + steps + 16, attention)
    times: dict[str, list[float]] = {"legacy": [], "new": []}
    for step in range(steps + 3):
        batch = advance(seqs, rng)
        order = [("legacy", legacy_prepare, legacy_self), ("new", new_prepare, new_self)]
        if step % 2:
            order.reverse()
        for name, fn, state in order:
            t = time.perf_counter()
            fn(state, batch)
            if step >= 3:  # the first steps add the rows
                times[name].append(time.perf_counter() - t)
    return statistics.median(times["legacy"]) * 1e3, statistics.median(times["new"]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,32,256")
    parser.add_argument("--contexts", default="32,1024")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "input_batch.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ns = [int(n) for n in args.ns.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = [
        "| N | context | inputs only: lists (ms) | persistent (ms) | speed-up "
        "| with attention metadata: lists (ms) | persistent (ms) | speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n in ns:
        for context in contexts:
            bare = measure(n, context, args.steps, _NoAttention)
            full = measure(n, context, args.steps, TorchAttentionMetadata)
            rows.append(
                f"| {n} | {context} | {bare[0]:.3f} | {bare[1]:.3f} | {bare[0] / bare[1]:.2f}x "
                f"| {full[0]:.3f} | {full[1]:.3f} | {full[0] / full[1]:.2f}x |"
            )
            print(rows[-1], flush=True)
    report = [
        *hostinfo.heading(
            "A step's input preparation: Python lists against the persistent input batch",
            f"{args.threads} thread(s).",
        ),
        "",
        "Decode steps of N sequences at the given context (temperature, top-k and top-p "
        "sampling), each step one token more per sequence; the two paths take turns on the "
        f"same batches in one process, median of {args.steps} steps each. `lists`: the runner's "
        "prepare before engine/step/input_batch.py (bench/engine_step/input_batch.py's "
        "`legacy_prepare`); `persistent`: `ModelRunner.prepare` now. Both include the sampling "
        "tensors; the right half adds the torch backend's attention metadata (the same work on "
        "both paths). CPU device: no host-to-device copies on either path.",
        "",
        *rows,
        "",
    ]
    args.out.write_text("\n".join(report))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
