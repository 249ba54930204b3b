"""Triton kernels for the paged KV cache: write K/V by slot, decode attention, prefill attention.

Imported only through `trio_llm.kernels._loader`, which decides (before this module's
`@triton.jit` decorators run) whether the kernels are compiled for the GPU or interpreted on CPU.

Layout invariants every kernel keeps: a cache is `[num_blocks, block_size, Hkv, D]` with a unit
stride along D; token `pos` of sequence b lives in block `block_tables[b, pos // block_size]` at
offset `pos % block_size`; scores are kept in the log2 domain (`scale * log2(e)` folded in, so
`exp2` replaces `exp`) and every sum is fp32 whatever the input dtype.

Work split, chosen for a memory-bound decode:
- one program per (sequence, KV head, context split) handles the whole query group of that KV
  head, so each K/V byte is read once per step however many query heads share it (GQA);
- the K/V tile spans BLOCK_N tokens, independent of the cache's block size: each token's block id
  is looked up in the block table (an L1-resident read), so a tile can span several pages and keep
  many independent loads in flight;
- long contexts are split into `num_splits` chunks (flash-decoding); each writes an unnormalised
  partial output with its running max and sum, and a small reduce kernel merges them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.interpreter import InterpretedFunction

from trio_llm.kernels._config import (
    MAX_SPLITS,
    DecodeConfig,
    PrefillConfig,
    decode_config,
    prefill_config,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        block = slot // PAGE
        offset = slot % PAGE
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
        t64 = t.to(tl.int64)
        k = tl.load(key_ptr + t64 * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(value_ptr + t64 * stride_vt + h * stride_vh + d, mask=mask)
        k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kct + h * stride_kch + d
        v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vct + h * stride_vch + d
        tl.store(k_dst, k, mask=mask)
        tl.store(v_dst, v, mask=mask)


@triton.jit
def _attend_tile(
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


# Arguments that change with the batch (table width, split count) are not specialised: Triton
# would otherwise compile a new variant, mid-serving, whenever one of them became 1 or a multiple
# of 16. What is left to specialise on is fixed per model (head counts, head dim, cache strides).
@triton.jit(do_not_specialize=["split_len", "num_splits", "stride_tb"])
def _decode_kernel(
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
        m_i, l_i, acc = _attend_tile(
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
def _decode_reduce_kernel(
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


@triton.jit(do_not_specialize=["num_seqs", "stride_tb"])
def _prefill_kernel(
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
            m_i, l_i, acc = _attend_tile(
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


_INTERPRETED = isinstance(_decode_kernel, InterpretedFunction)


def _next_pow2(n: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs keep fp32 products (the tensor cores' tf32 would cost ~1e-3 relative error).
    return "ieee" if dtype == torch.float32 else "tf32"


def write_kv(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    block_h, block_d = _next_pow2(num_kv_heads, 1), _next_pow2(head_dim)
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE=k_cache.shape[1],
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        # One token's K and V are small: spread them so each thread moves 16-byte vectors.
        num_warps=max(1, min(4, block_h * block_d // 256)),
    )


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
    block_d = _next_pow2(head_dim)
    split_len = -(-max_context // config.num_splits)
    split_len = -(-split_len // config.block_n) * config.block_n
    num_splits = -(-max_context // split_len)
    if num_splits > 1:
        partial = (batch, num_heads, num_splits)
        part_acc = torch.empty((*partial, block_d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((*partial, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused: the kernel writes the output directly
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_acc,
        part_ml,
        scale * _LOG2E,
        *_launch_strides(q, k_cache, v_cache, block_tables, out),
        num_heads,
        split_len,
        num_splits,
        BLOCK_G=_next_pow2(group),
        SPLIT=num_splits > 1,
        **_launch_meta(q, head_dim, group, block_size, config),
    )
    if num_splits > 1:
        _decode_reduce_kernel[(batch, num_kv_heads)](
            part_acc,
            part_ml,
            out,
            out.stride(0),
            out.stride(1),
            num_heads,
            num_splits,
            HEAD_DIM=head_dim,
            GROUP=group,
            BLOCK_G=_next_pow2(group, 1),
            # One variant for every split count the heuristic picks (at most MAX_SPLITS).
            BLOCK_S=max(MAX_SPLITS, _next_pow2(num_splits)),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out


def _launch_strides(
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


def _launch_meta(
    q: Tensor, head_dim: int, group: int, block_size: int, config: DecodeConfig | PrefillConfig
) -> dict[str, object]:
    """The compile-time parameters both attention kernels share: each distinct set is one
    compiled variant."""
    return {
        "HEAD_DIM": head_dim,
        "GROUP": group,
        "BLOCK_D": _next_pow2(head_dim),
        "BLOCK_N": config.block_n,
        "PAGE": block_size,
        "DOT_PRECISION": _dot_precision(q.dtype),
        "UPCAST": _INTERPRETED and q.dtype != torch.float32,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


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
    block_m = max(config.block_m, _next_pow2(group))
    block_q = block_m // group
    _prefill_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
        scale * _LOG2E,
        *_launch_strides(q, k_cache, v_cache, block_tables, out),
        num_seqs,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        **_launch_meta(q, head_dim, group, block_size, config),
    )
    return out
