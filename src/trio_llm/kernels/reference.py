"""Torch references for the paged-attention kernels: plain gather, softmax, fp32 accumulation.

These are the definitions the Triton kernels are tested against, and so is the engine's torch
backend (`trio_llm.engine.attention.torch_backend`, the same contract made fast for the CPU).
They favour obviousness over speed (a Python loop over sequences). Invariant: each reference
reads the cache exactly as the kernels do (slot = block_id * block_size + offset, block ids from
the sequence's row of `block_tables`) and returns `q.dtype`, computed in fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor


def write_kv_ref(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Scatter token t's K/V (`[T, Hkv, D]`) into cache slot `slot_mapping[t]`; slots < 0 are
    padding and are skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    # The caches are contiguous in the engine; view() refuses (rather than copies) otherwise.
    k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = key[keep]
    v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)[slots] = value[keep]


def _gather(cache: Tensor, table_row: Tensor, length: int) -> Tensor:
    """The first `length` tokens of one sequence, `[length, Hkv, D]` in fp32."""
    block_size = cache.shape[1]
    blocks = table_row[: -(-length // block_size)].long()
    return cache[blocks].flatten(0, 1)[:length].float()


def prefill_attention_ref(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    context_lens: Tensor,
    scale: float,
    *,
    window: int = 0,
    softcap: float | None = None,
) -> Tensor:
    """Causal attention of each sequence's query chunk over its cached K/V.

    Query i of sequence b (of q_len_b queries) sits at position context_lens[b] - q_len_b + i and
    sees cache positions <= its own (and, with `window` W > 0, > its own - W). A query that sees
    no position gets zeros. `softcap` c: scores become c * tanh(score / c) before the softmax.
    """
    num_heads = q.shape[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    cu = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    for b, ctx in enumerate(lens):
        start, end = cu[b], cu[b + 1]
        q_len = end - start
        if q_len == 0 or ctx == 0:
            continue
        k = _gather(k_cache, block_tables[b], ctx).repeat_interleave(group, dim=1)
        v = _gather(v_cache, block_tables[b], ctx).repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), k) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)
        visible = k_pos[None, :] <= q_pos[:, None]
        if window:
            visible &= k_pos[None, :] > q_pos[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out


def decode_attention_ref(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    *,
    window: int = 0,
    softcap: float | None = None,
) -> Tensor:
    """One query per sequence over its `context_lens[b]` cached tokens: prefill with q_len 1."""
    cu = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return prefill_attention_ref(
        q, k_cache, v_cache, block_tables, cu, context_lens, scale, window=window, softcap=softcap
    )
