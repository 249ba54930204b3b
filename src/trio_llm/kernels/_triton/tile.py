"""What both attention kernels share: the online-softmax step over one tile of cached K/V, and
the launch parameters they take alike.

Scores are kept in the log2 domain (`scale * log2(e)` folded in, so `exp2` replaces `exp`) and
every sum is fp32 whatever the input dtype.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from trio_llm.kernels._config import DecodeConfig, PrefillConfig

LOG2E = 1.4426950408889634


@triton.jit
def attend_tile(
    q,
    m_i,
    l_i,
    acc,
    k_cache_ptr,
    v_cache_ptr,
    table_row_ptr,
    kv_head,
    start,
    visible_end,
    q_pos,
    d,
    d_mask,
    scale_log2,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    CAUSAL: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One online-softmax step over cache positions [start, start + BLOCK_N) of one sequence.

    Rows of `q` are query (token, head) pairs; positions >= visible_end (and, if CAUSAL, past a
    row's own q_pos) are masked out. A row that sees nothing in this tile keeps its state.

    UPCAST is set only under the interpreter, which multiplies a bf16 `tl.dot`'s raw bit patterns
    (triton-lang/triton#11584) and runs an fp16 one through numpy's slow half-precision loops: it
    feeds the dots fp32 copies of the same 16-bit values, so the rounding matches the GPU's.
    """
    pos = start + tl.arange(0, BLOCK_N)
    in_range = pos < visible_end
    block_id = tl.load(table_row_ptr + pos // PAGE, mask=in_range, other=0).to(tl.int64)
    k_off = block_id * stride_kb + (pos % PAGE) * stride_kt + kv_head * stride_kh
    v_off = block_id * stride_vb + (pos % PAGE) * stride_vt + kv_head * stride_vh
    kv_mask = in_range[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + k_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + v_off[:, None] + d[None, :], mask=kv_mask, other=0.0)

    if UPCAST:
        k = k.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    seen = in_range[None, :]
    if CAUSAL:
        seen = seen & (pos[None, :] <= q_pos[:, None])
    s = tl.where(seen, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row with nothing seen so far keeps m = -inf; subtracting 0 instead keeps it NaN-free.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    p_low = p.to(v.dtype)  # the GPU's tensor cores take P in V's precision
    if UPCAST:
        p_low = p_low.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p_low, v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


INTERPRETED = isinstance(attend_tile, InterpretedFunction)
"""Whether this process loaded the kernels into Triton's CPU interpreter."""


def next_pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs keep fp32 products (the tensor cores' tf32 would cost ~1e-3 relative error).
    return "ieee" if dtype == torch.float32 else "tf32"


def launch_strides(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, out: Tensor
) -> tuple[int, ...]:
    """The strides both attention kernels take, in their parameter order: the kernels index
    the caches and tables by stride, so a view with other strides reads the right memory."""
    return (
        *q.stride()[:2],
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        block_tables.stride(0),
        *out.stride()[:2],
    )


def launch_meta(
    q: Tensor, head_dim: int, group: int, block_size: int, config: DecodeConfig | PrefillConfig
) -> dict[str, object]:
    """The compile-time parameters both attention kernels share: each distinct set is one
    compiled variant."""
    return {
        "HEAD_DIM": head_dim,
        "GROUP": group,
        "BLOCK_D": next_pow2(head_dim),
        "BLOCK_N": config.block_n,
        "PAGE": block_size,
        "DOT_PRECISION": dot_precision(q.dtype),
        "UPCAST": INTERPRETED and q.dtype != torch.float32,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
