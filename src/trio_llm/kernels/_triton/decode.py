"""Decode attention: one query token per sequence, split along the context (flash-decoding).

One program per (sequence, KV head, context split) handles the whole query group of that KV
head; with more than one split, each writes an unnormalised partial output with its running max
and sum, and `decode_reduce_kernel` merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from trio_llm.kernels._config import MAX_SPLITS, DecodeConfig, decode_config
from trio_llm.kernels._triton.tile import LOG2E, attend_tile, launch_meta, launch_strides, next_pow2


# Arguments that change with the batch (table width, split count) are not specialised: Triton
# would otherwise compile a new variant, mid-serving, whenever one of them became 1 or a multiple
# of 16. What is left to specialise on is fixed per model (head counts, head dim, cache strides).
@triton.jit(do_not_specialize=["split_len", "num_splits", "stride_tb"])
def decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_tb,
    stride_ob,
    stride_oh,
    num_heads,
    split_len,
    num_splits,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + b).to(tl.int32)  # int32 or int64 in; int32 loop bounds
    start = split * split_len
    end = tl.minimum(start + split_len, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    head = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    b64 = b.to(tl.int64)
    q = tl.load(
        q_ptr + b64 * stride_qb + head[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_G], 0.0, tl.float32)
    acc = tl.full([BLOCK_G, BLOCK_D], 0.0, tl.float32)
    table_row = block_tables_ptr + b64 * stride_tb
    for n0 in range(start, end, BLOCK_N):
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
            g,
            d,
            d_mask,
            scale_log2,
            stride_kb,
            stride_kt,
            stride_kh,
            stride_vb,
            stride_vt,
            stride_vh,
            False,
            PAGE,
            BLOCK_N,
            DOT_PRECISION,
            UPCAST,
        )

    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        # Partials are [B, Hq, num_splits, BLOCK_D] and [B, Hq, num_splits, 2] (max, sum), fp32.
        # An empty split (past this sequence's end: sum 0) writes only its (max, sum) = (-inf, 0).
        row = (b64 * num_heads + head) * num_splits + split
        acc_dst = part_acc_ptr + row[:, None] * BLOCK_D + d[None, :]
        tl.store(acc_dst, acc, mask=out_mask & (l_i > 0.0)[:, None])
        tl.store(part_ml_ptr + row * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=g_mask)
    else:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        dst = out_ptr + b64 * stride_ob + head[:, None] * stride_oh + d[None, :]
        tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["num_splits"])
def decode_reduce_kernel(
    part_acc_ptr,
    part_ml_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_heads,
    num_splits,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge one (sequence, KV head)'s split partials: weight each by exp2(its max - the global
    max), sum, divide by the equally weighted sums. Empty splits weigh 0 and are not read."""
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    g = tl.arange(0, BLOCK_G)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    g_mask = g < GROUP
    head = kv_head * GROUP + g
    row = (b * num_heads + head) * num_splits
    ml_mask = g_mask[:, None] & (s < num_splits)[None, :]
    m_all = tl.load(
        part_ml_ptr + (row[:, None] + s[None, :]) * 2, mask=ml_mask, other=float("-inf")
    )
    m_max = tl.max(m_all, axis=1)
    m_ref = tl.where(m_max == float("-inf"), 0.0, m_max)
    total = tl.full([BLOCK_G], 0.0, tl.float32)
    acc = tl.full([BLOCK_G, BLOCK_D], 0.0, tl.float32)
    for i in range(num_splits):
        m_i = tl.load(part_ml_ptr + (row + i) * 2, mask=g_mask, other=float("-inf"))
        l_i = tl.load(part_ml_ptr + (row + i) * 2 + 1, mask=g_mask, other=0.0)
        w = tl.exp2(m_i - m_ref)
        part = part_acc_ptr + (row + i)[:, None] * BLOCK_D + d[None, :]
        acc += w[:, None] * tl.load(part, mask=(g_mask & (l_i > 0.0))[:, None], other=0.0)
        total += w * l_i
    out = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    dst = out_ptr + b * stride_ob + head[:, None] * stride_oh + d[None, :]
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & (d < HEAD_DIM)[None, :])


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    config: DecodeConfig | None = None,
) -> Tensor:
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    if batch == 0:
        return out
    # The table's width bounds every context, so the launch never reads context_lens on the host.
    max_context = block_tables.shape[1] * block_size
    if config is None:
        config = decode_config(batch, num_kv_heads, max_context, q.device)
    group = num_heads // num_kv_heads
    block_d = next_pow2(head_dim)
    split_len = -(-max_context // config.num_splits)
    split_len = -(-split_len // config.block_n) * config.block_n
    num_splits = -(-max_context // split_len)
    if num_splits > 1:
        partial = (batch, num_heads, num_splits)
        part_acc = torch.empty((*partial, block_d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((*partial, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused: the kernel writes the output directly
    decode_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_acc,
        part_ml,
        scale * LOG2E,
        *launch_strides(q, k_cache, v_cache, block_tables, out),
        num_heads,
        split_len,
        num_splits,
        BLOCK_G=next_pow2(group),
        SPLIT=num_splits > 1,
        **launch_meta(q, head_dim, group, block_size, config),
    )
    if num_splits > 1:
        decode_reduce_kernel[(batch, num_kv_heads)](
            part_acc,
            part_ml,
            out,
            out.stride(0),
            out.stride(1),
            num_heads,
            num_splits,
            HEAD_DIM=head_dim,
            GROUP=group,
            BLOCK_G=next_pow2(group, 1),
            # One variant for every split count the heuristic picks (at most MAX_SPLITS).
            BLOCK_S=max(MAX_SPLITS, next_pow2(num_splits)),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
