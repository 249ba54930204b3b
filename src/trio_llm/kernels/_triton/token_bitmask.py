"""Masking the logits of disallowed tokens with a grammar's bitmask: one program per
(constrained row, vocabulary block)."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

BLOCK_V = 1024


@triton.jit
def token_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    rows_ptr,
    vocab,
    words,
    stride_logits,
    stride_mask,
    BLOCK: tl.constexpr,
):
    r = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(rows_ptr + r).to(tl.int64)
    word = offs // 32
    # A token past the bitmask's width is not allowed: its word reads as 0.
    bits = tl.load(bitmask_ptr + r * stride_mask + word, mask=word < words, other=0)
    allowed = (bits >> (offs % 32)) & 1
    ptrs = logits_ptr + row * stride_logits + offs
    tl.store(ptrs, float("-inf"), mask=(offs < vocab) & (allowed == 0))


def apply_token_bitmask(logits: Tensor, bitmask: Tensor, rows: Tensor) -> None:
    num_rows, vocab = bitmask.shape[0], logits.shape[1]
    if num_rows == 0:
        return
    grid = (num_rows, triton.cdiv(vocab, BLOCK_V))
    token_bitmask_kernel[grid](
        logits,
        bitmask,
        rows,
        vocab,
        bitmask.shape[1],
        logits.stride(0),
        bitmask.stride(0),
        BLOCK=BLOCK_V,
    )
