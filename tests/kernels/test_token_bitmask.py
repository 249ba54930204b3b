"""The grammar bitmask applied to logits: the Triton kernel and the CPU path against the torch
reference, on vocabularies that are and are not multiples of 32, bitmasks narrower than the
vocabulary, and subsets of rows in any order."""

from __future__ import annotations

import pytest
import torch

from trio_llm.kernels._loader import load_triton
from trio_llm.kernels.token_bitmask import apply_token_bitmask, apply_token_bitmask_ref


def case(
    batch: int, vocab: int, words: int, rows: list[int], seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (len(rows), words), generator=g, dtype=torch.int64)
    return logits, bitmask.to(torch.int32), torch.tensor(rows, dtype=torch.long)


CASES = [
    (1, 64, 2, [0]),
    (4, 100, 4, [3, 1]),  # vocab not a multiple of 32, rows out of order
    (3, 49152, 1536, [0, 1, 2]),  # every row: the in-place path
    (5, 70, 2, [4]),  # a bitmask narrower than the vocabulary: the rest is disallowed
    (2, 33, 2, []),
]


@pytest.mark.parametrize(("batch", "vocab", "words", "rows"), CASES)
def test_cpu_path_matches_reference(batch: int, vocab: int, words: int, rows: list[int]) -> None:
    logits, bitmask, index = case(batch, vocab, words, rows)
    expected = logits.clone()
    apply_token_bitmask_ref(expected, bitmask, index)
    got = logits.clone()
    apply_token_bitmask(got, bitmask, index)
    assert torch.equal(got, expected)
    untouched = [r for r in range(batch) if r not in rows]
    assert torch.equal(got[untouched], logits[untouched])


@pytest.mark.parametrize(("batch", "vocab", "words", "rows"), CASES[:2] + CASES[3:])
def test_triton_kernel_matches_reference(
    device: torch.device, batch: int, vocab: int, words: int, rows: list[int]
) -> None:
    logits, bitmask, index = case(batch, vocab, words, rows, seed=1)
    expected = logits.clone()
    apply_token_bitmask_ref(expected, bitmask, index)
    got = logits.clone().to(device)
    load_triton().apply_token_bitmask(got, bitmask.to(device), index.to(device))
    assert torch.equal(got.cpu(), expected)


def test_reference_reads_llguidance_bit_order() -> None:
    logits = torch.zeros(1, 40)
    bitmask = torch.tensor([[1 << 3, 1 << 1]], dtype=torch.int32)  # tokens 3 and 33
    apply_token_bitmask_ref(logits, bitmask, torch.tensor([0]))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [3, 33]
    logits = torch.zeros(1, 40)
    apply_token_bitmask(logits, bitmask, torch.tensor([0]))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [3, 33]
