"""Prefill attention: causal attention of packed query chunks over their sequences' caches.

One program per (tile of query tokens, KV head); a tile's rows are (token, query head) pairs of
one sequence, found by a binary search over `cu_seqlens_q` on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from trio_llm.kernels._config import PrefillConfig, prefill_config
from trio_llm.kernels._triton.tile import LOG2E, attend_tile, launch_meta, launch_strides, next_pow2


@triton.jit(do_not_specialize=["num_seqs", "stride_tb"])
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    cu_seqlens_q_ptr,
    context_lens_ptr,
    out_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_tb,
    stride_ot,
    stride_oh,
    num_seqs: tl.int32,  # typed, so that 1 is not made a constexpr: it seeds a loop-carried value
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    # Sequence b owns the tiles [cu[b] // BLOCK_Q + b, cu[b + 1] // BLOCK_Q + b + 1): enough for
    # its queries, and the grid (T // BLOCK_Q + B tiles) is known without reading cu on the host.
    # Binary search for the last b whose first tile is <= this one (lo and hi are loop-carried
    # int32 values, hence the annotations).
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(cu_seqlens_q_ptr + mid).to(tl.int32) // BLOCK_Q + mid
        if first <= tile:
            lo = mid + 1
        else:
            hi = mid
    b = lo - 1
    q_start = tl.load(cu_seqlens_q_ptr + b).to(tl.int32)
    q_len = tl.load(cu_seqlens_q_ptr + b + 1).to(tl.int32) - q_start
    t0 = (tile - (q_start // BLOCK_Q + b)) * BLOCK_Q
    if t0 < q_len:
        ctx = tl.load(context_lens_ptr + b).to(tl.int32)  # int32 or int64 in; int32 loop bounds
        r = tl.arange(0, BLOCK_M)
        t = t0 + r // GROUP
        head = kv_head * GROUP + r % GROUP
        row_mask = (r < BLOCK_Q * GROUP) & (t < q_len)
        q_pos = ctx - q_len + t
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        token = (q_start + t).to(tl.int64)
        mask = row_mask[:, None] & d_mask[None, :]
        q = tl.load(
            q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
            mask=mask,
            other=0.0,
        )
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.full([BLOCK_M], 0.0, tl.float32)
        acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
        table_row = block_tables_ptr + b.to(tl.int64) * stride_tb
        # The last query of this tile sees up to its own position; later keys are never visible.
        end = tl.minimum(ctx, ctx - q_len + tl.minimum(t0 + BLOCK_Q, q_len))
        for n0 in range(0, end, BLOCK_N):
            m_i, l_i, acc = attend_tile(
                q,
                m_i,
                l_i,
                acc,
                k_cache_ptr,
                v_cache_ptr,
                table_row,
                kv_head,
                n0,
                end,
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
                True,
                PAGE,
                BLOCK_N,
                DOT_PRECISION,
                UPCAST,
            )
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        dst = out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mask)


def prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    context_lens: Tensor,
    scale: float,
    config: PrefillConfig | None = None,
) -> Tensor:
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    num_seqs = cu_seqlens_q.shape[0] - 1
    if num_tokens == 0 or num_seqs == 0:
        return out
    config = config or prefill_config(q.dtype)
    group = num_heads // num_kv_heads
    block_m = max(config.block_m, next_pow2(group))
    block_q = block_m // group
    prefill_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
        scale * LOG2E,
        *launch_strides(q, k_cache, v_cache, block_tables, out),
        num_seqs,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        **launch_meta(q, head_dim, group, block_size, config),
    )
    return out
