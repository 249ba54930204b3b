"""The persistent input batch holds what the sequences' own lists hold, step after step, through
rows added, grown, removed and reused."""

from __future__ import annotations

import random

import numpy as np
import torch

from trio_llm.engine.step.input_batch import InputBatch, Staging
from trio_llm.engine.step.sequence import Sequence
from trio_llm.sampling_params import SamplingParams

BLOCK = 4


def _seq(rng: random.Random, n: int, **params: object) -> Sequence:
    seq = Sequence(
        request_id=str(rng.random()),
        token_ids=[rng.randrange(1000) for _ in range(n)],
        params=SamplingParams(**params),  # type: ignore[arg-type]
        max_tokens=100,
    )
    seq.block_table = [rng.randrange(500) for _ in range(-(-n // BLOCK))]
    return seq


def _check(batch: InputBatch, seqs: list[Sequence], rows: np.ndarray) -> None:
    width = max(len(s.block_table) for s in seqs)
    expected = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        expected[i, : len(s.block_table)] = s.block_table
        n = len(s.token_ids)
        assert batch.num_tokens[rows[i]] == n
        assert batch.token_ids[rows[i], :n].tolist() == s.token_ids
    assert np.array_equal(batch.tables(rows), expected)


def test_rows_follow_their_sequences_through_appends_removals_and_reuse() -> None:
    rng = random.Random(0)
    batch = InputBatch(BLOCK, max_model_len=4096, rows=2)
    live = [_seq(rng, rng.randrange(1, 40)) for _ in range(3)]
    for step in range(60):
        # Every live sequence gains a token (a new block at each block boundary); some
        # finish, new ones arrive, and one is now and then preempted (its table refilled).
        for s in live:
            s.token_ids.append(rng.randrange(1000))
            if len(s.token_ids) > len(s.block_table) * BLOCK:
                s.block_table.append(rng.randrange(500))
        removed = [s for s in live if rng.random() < 0.15]
        live = [s for s in live if s not in removed]
        if step % 7 == 3 and live:
            victim = live[0]
            removed.append(victim)
            victim.block_table = [rng.randrange(500) for _ in victim.block_table]
        live += [_seq(rng, rng.randrange(1, 300)) for _ in range(rng.randrange(3))]
        if not live:
            continue
        batch.remove(removed)
        rng.shuffle(live)
        rows = batch.sync(live)
        assert len(set(rows.tolist())) == len(live)
        _check(batch, live, rows)
    assert len(batch) == len(live)


def test_a_removed_row_is_clean_when_reused() -> None:
    rng = random.Random(1)
    batch = InputBatch(BLOCK, max_model_len=256, rows=1)
    long = _seq(rng, 40)
    batch.sync([long])
    batch.remove([long])
    short = _seq(rng, 3)
    rows = batch.sync([short])
    assert batch.block_table[rows[0]].tolist()[1:] == [0] * (batch.block_table.shape[1] - 1)


def test_sampling_columns_hold_each_rows_parameters() -> None:
    rng = random.Random(2)
    seqs = [
        _seq(rng, 5, temperature=0.0),
        _seq(rng, 5, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05),
    ]
    batch = InputBatch(BLOCK, max_model_len=64)
    cols = batch.sampling(batch.sync(seqs))
    assert cols.greedy.tolist() == [True, False]
    assert cols.temperature.tolist() == [1.0, np.float32(0.7)]
    assert cols.top_k.tolist() == [0, 20]
    assert cols.top_p.tolist() == [1.0, np.float32(0.9)]
    assert cols.min_p.tolist() == [0.0, np.float32(0.05)]


def test_cpu_staging_shares_the_arrays_memory() -> None:
    staging = Staging(torch.device("cpu"))
    array = np.arange(6, dtype=np.int64)
    tensor = staging.to_device("x", array)
    assert tensor.data_ptr() == array.ctypes.data
    assert staging.to_host("y", tensor).tolist() == list(range(6))
