"""The torch attention backend: the CPU hot path, on `F.scaled_dot_product_attention` and,
for decodes, a kernel of our own that reads the paged cache in place (ops/paged_decode.py).

It implements the contract of the Triton kernels (`trio_llm.kernels`): given the same plans,
`store_kv`, `decode_on_plan` and `prefill_on_plans` give what the kernels' `write_kv`,
`decode_attention` and `prefill_attention` give, and tests/kernels runs them on the same cases
against the same references (`trio_llm.kernels.reference`). The references define the contract
obviously (a Python loop over sequences, fp32 einsums); this is the fast implementation of it.

What is fast about it: everything that depends on the step but not on the layer (which blocks
each decode gathers, the masks, the gather buffers, each prefill chunk's context slots) is a plan
built once per step by `TorchAttentionMetadata.build` (torch_plans.py); each layer then runs
`store_kv`, `decode_on_plan` and `prefill_on_plans` on the plans, a handful of large tensor ops.
Decodes skip the gather where the in-place kernel is built; with batch invariance the prefill
queries then run on it too, each as a decode of its position (elsewhere invariance lays them out
as decodes over key buckets on the SDPA path).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.attention.interface import (
    StepLayout,
    ToDevice,
    as_tensor,
    decodes_then_prefills,
)
from trio_llm.engine.attention.torch_plans import (
    BucketedChunk,
    DecodePlan,
    PrefillChunk,
    plan_bucketed_prefill,
    plan_prefill,
    queries_as_decodes,
)
from trio_llm.engine.ops import paged_amx, paged_decode
from trio_llm.engine.ops.threads import rowwise


@dataclass(slots=True)
class TorchAttentionMetadata:
    """One step of the torch backend: the slots to write and the plans every layer reads."""

    slot_mapping: Tensor
    """[T] int64, never negative (the engine does not pad)."""
    num_decodes: int
    """Rows computed as decodes: the decodes, or every row (invariance on the in-place kernel)."""
    decode: DecodePlan | None = None
    decode_groups: list[tuple[Tensor, DecodePlan]] = field(default_factory=list)
    """With key buckets: (decode rows, their plan) per bucket, instead of `decode`."""
    prefills: list[PrefillChunk] = field(default_factory=list)
    """Row offsets relative to row `num_decodes`."""
    bucketed: list[BucketedChunk] = field(default_factory=list)
    """With key buckets: the prefill queries as decodes, instead of `prefills`."""
    fresh_kv: bool = True
    """A chunk that is its sequence's whole context may attend over the new K/V directly."""
    layout: StepLayout | None = None
    """What it was built from: a layer with another window or cache shape gets its own plans
    from it (`variant`)."""
    key: tuple[int, tuple[int, ...]] = (0, ())
    """(window, cache row shape) these plans are for."""
    variants: dict[tuple[int, tuple[int, ...]], TorchAttentionMetadata] = field(
        default_factory=dict
    )
    """This step's plans for the other (window, cache shape) pairs its layers have."""

    @classmethod
    def build(
        cls,
        layout: StepLayout,
        cache: Tensor,
        to_device: ToDevice | None = None,
        window: int = 0,
    ) -> TorchAttentionMetadata:
        """`to_device(name, array)` carries the slot mapping (the plans' small arrays are built
        per step, on the CPU path where a copy is free). `window`: plans for a sliding-window
        layer; other layers' plans are built when a layer first asks (`variant`)."""
        device = cache.device
        nd = layout.num_decodes
        bucket = layout.key_bucket
        slots = (
            to_device("slot_mapping", layout.slot_mapping)
            if to_device is not None
            else as_tensor(layout.slot_mapping, device)
        )
        meta = cls(
            slot_mapping=slots,
            num_decodes=nd,
            fresh_kv=not bucket,
            layout=layout,
            key=(window, tuple(cache.shape[2:])),
        )
        tables, lens = layout.block_tables, layout.context_lens
        in_place = paged_decode.supports(cache)
        amx = not window and paged_amx.serves(cache)
        if (bucket and in_place) or (amx and layout.plain_attention):
            # Every query, decode or prefill, as a decode of its own position
            # (`queries_as_decodes`), so the whole step is `decode`: with invariance, on the
            # in-place kernel, which computes a query from its own context alone; and on AMX
            # tiles wherever they run (a layer with a window or a soft-cap keeps the float
            # kernel), invariance or not: the tiles take a prefill's queries faster than SDPA
            # does (0.74-0.85x its time for 512-query chunks) and decodes faster than the float
            # kernel (0.62-0.81x; docs/notes/2026-12-06-sixth.md). Where AMX is absent and
            # AVX512-BF16 is not (an EPYC), the same kernel on vector products takes a prefill
            # in 0.2-0.3x the float kernel's time and decodes at par with it
            # (docs/notes/2026-12-06-eighth.md).
            q_tables, q_lens = queries_as_decodes(tables, layout.cu_seqlens_q, lens)
            meta.num_decodes = len(q_lens)
            meta.decode = DecodePlan.build(
                q_tables,
                q_lens,
                cache,
                window=window,
                in_place=True,
                amx=amx,
                split=bool(bucket) and paged_amx.splits_for_invariance(),
            )
            return meta
        if nd and bucket:
            lengths = -(-lens[:nd] // bucket) * bucket
            for length in np.unique(lengths).tolist():
                rows = np.flatnonzero(lengths == length)
                plan = DecodePlan.build(
                    tables[rows], lens[rows], cache, length=length, window=window
                )
                meta.decode_groups.append((as_tensor(rows, device), plan))
        elif nd:
            meta.decode = DecodePlan.build(
                tables[:nd], lens[:nd], cache, window=window, in_place=in_place
            )
        if nd < len(lens):
            cu = layout.cu_seqlens_q[nd:] - layout.cu_seqlens_q[nd]
            if bucket:
                meta.bucketed = plan_bucketed_prefill(
                    tables[nd:], cu, lens[nd:], cache.shape[1], device, bucket, window=window
                )
            else:
                meta.prefills = plan_prefill(
                    tables[nd:], cu, lens[nd:], cache.shape[1], device, window=window
                )
        return meta

    def variant(self, window: int | None, cache: Tensor) -> TorchAttentionMetadata:
        """The plans for a layer with this sliding `window` (None: none) and cache: these, when
        the window reaches past every context and the cache has the shape they were built for
        (every layer of most models), else this step's plans for that pair, built once."""
        longest = 0 if self.layout is None else int(self.layout.context_lens.max(initial=0))
        key = (window if window and window < longest else 0, tuple(cache.shape[2:]))
        if key == self.key or self.layout is None:
            return self
        found = self.variants.get(key)
        if found is None:
            found = self.variants[key] = TorchAttentionMetadata.build(
                self.layout, cache, window=key[0]
            )
            found.slot_mapping = self.slot_mapping
        return found

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        plans = self.variant(window, k_cache)
        store_kv(k, v, k_cache, v_cache, plans.slot_mapping)
        nd = plans.num_decodes

        def decodes(qd: Tensor) -> Tensor:
            if plans.decode is not None:
                return decode_on_plan(
                    qd, k_cache, v_cache, plans.decode, scale, softcap, sliding=bool(window)
                )
            out = qd.new_empty(qd.shape)
            for rows, plan in plans.decode_groups:
                out[rows] = decode_on_plan(
                    qd.index_select(0, rows), k_cache, v_cache, plan, scale, softcap, entrywise=True
                )
            return out

        def prefills(qp: Tensor, out: Tensor) -> None:
            if plans.bucketed:
                _prefill_as_decodes(qp, k_cache, v_cache, plans.bucketed, scale, out, softcap)
                return
            fresh = (k[nd:], v[nd:]) if plans.fresh_kv else None
            prefill_on_plans(qp, k_cache, v_cache, plans.prefills, scale, out, fresh, softcap)

        return decodes_then_prefills(q, nd, decodes, prefills)


def _rows(cache: Tensor) -> Tensor:
    """The cache as rows of [Hkv * D], one per slot: index_copy_ and index_select over 2-D rows
    are many times faster than over 3-D."""
    return cache.view(cache.shape[0] * cache.shape[1], -1)


def store_kv(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor) -> None:
    """`write_kv` for int64 slots that are all valid (no padding)."""
    num_tokens = slots.shape[0]
    _rows(k_cache).index_copy_(0, slots, key.reshape(num_tokens, -1))
    _rows(v_cache).index_copy_(0, slots, value.reshape(num_tokens, -1))


def decode_on_plan(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    softcap: float | None = None,
    *,
    entrywise: bool = False,
    sliding: bool = False,
) -> Tensor:
    """One query per sequence, [B, Hq, D], over each sequence's blocks: read where they lie by
    the in-place kernel when the plan is for it, else gathered and handed to SDPA.
    `entrywise`: see `sdpa`. `sliding`: the layer has a sliding window, whether or not it
    reaches past this step's contexts: such a layer keeps the float kernel, so that which
    kernel computes it never depends on the batch's longest context."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if plan.length == 0:
        return q.new_zeros(q.shape)
    if plan.in_place is not None:
        paged = plan.in_place
        if paged.amx and not softcap and not sliding:
            return paged_amx.paged_attention(
                q,
                k_cache,
                v_cache,
                paged.block_tables,
                paged.context_lens,
                scale,
                split=paged.split,
            )
        return paged_decode.paged_decode(
            q,
            k_cache,
            v_cache,
            paged.block_tables,
            paged.context_lens,
            scale,
            softcap,
            paged.window,
        )
    k_buf, v_buf = plan.buffers
    # Whole blocks (rows of block_size * Hkv * D) copy faster than token rows.
    torch.index_select(k_cache.view(k_cache.shape[0], -1), 0, plan.blocks, out=k_buf)
    torch.index_select(v_cache.view(v_cache.shape[0], -1), 0, plan.blocks, out=v_buf)
    kd = k_buf.view(batch, -1, num_kv_heads, head_dim)[:, : plan.length].transpose(1, 2)
    vd = v_buf.view(batch, -1, num_kv_heads, head_dim)[:, : plan.length].transpose(1, 2)
    # The query heads sharing a KV head become that head's query rows ([B, Hkv, group, D]):
    # no KV head is repeated, and with one query per sequence no mask is causal.
    qd = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = sdpa(qd, kd, vd, plan.mask, scale=scale, softcap=softcap, entrywise=entrywise)
    out = out.reshape(batch, num_heads, head_dim)
    if plan.empty is not None:
        out[plan.empty] = 0
    return out


def prefill_on_plans(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    chunks: list[PrefillChunk],
    scale: float,
    out: Tensor,
    new_kv: tuple[Tensor, Tensor] | None = None,
    softcap: float | None = None,
) -> None:
    """Each chunk's queries, causal over its earlier positions and the chunk, into `out`.

    `new_kv`: the K/V rows of `q`'s tokens, just written to the cache. A chunk that is its
    sequence's whole context then attends over them directly: the values its context slots hold,
    without the gather (10 % of a whole-prompt prefill's attention time)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    k_rows, v_rows = _rows(k_cache), _rows(v_cache)
    for chunk in chunks:
        if new_kv is not None and chunk.mask is None:
            kc = new_kv[0][chunk.start : chunk.end]
            vc = new_kv[1][chunk.start : chunk.end]
        else:
            kc = k_rows.index_select(0, chunk.context_slots).view(-1, num_kv_heads, head_dim)
            vc = v_rows.index_select(0, chunk.context_slots).view(-1, num_kv_heads, head_dim)
        queries = q[chunk.start : chunk.end]
        attended = sdpa(
            queries.transpose(0, 1).unsqueeze(0),  # [1, Hq, n, D]
            kc.transpose(0, 1).unsqueeze(0),
            vc.transpose(0, 1).unsqueeze(0),
            chunk.mask,
            scale=scale,
            softcap=softcap,
            is_causal=chunk.mask is None,
            enable_gqa=num_heads != num_kv_heads,
        )[0].transpose(0, 1)
        out[chunk.start : chunk.end] = attended


def _prefill_as_decodes(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    chunks: list[BucketedChunk],
    scale: float,
    out: Tensor,
    softcap: float | None = None,
) -> None:
    """Each chunk's queries as `decode_on_plan` computes a decode: [n, Hkv, group, D] queries,
    each over its own batch entry of `length` keys (the chunk's context, shared, not copied)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    k_rows, v_rows = _rows(k_cache), _rows(v_cache)
    for chunk in chunks:
        # [Hkv, longest, D], as the decode's gathered blocks are laid out per entry.
        kc = k_rows.index_select(0, chunk.context_slots).view(-1, num_kv_heads, head_dim)
        vc = v_rows.index_select(0, chunk.context_slots).view(-1, num_kv_heads, head_dim)
        kc, vc = kc.transpose(0, 1), vc.transpose(0, 1)
        for g in chunk.groups:
            n = g.end - g.start
            attended = sdpa(
                q[g.start : g.end].reshape(n, num_kv_heads, group, head_dim),
                kc[:, : g.length].expand(n, -1, -1, -1),
                vc[:, : g.length].expand(n, -1, -1, -1),
                g.mask,
                scale=scale,
                softcap=softcap,
                entrywise=True,
            )
            out[g.start : g.end] = attended.reshape(n, num_heads, head_dim)


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    scale: float,
    softcap: float | None = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
    entrywise: bool = False,
) -> Tensor:
    """`F.scaled_dot_product_attention`, or, for a layer that soft-caps its attention scores
    (`softcap * tanh(scores / softcap)`, Gemma 2), the same attention written out, as
    transformers' eager attention computes it (SDPA has no soft-capping). `entrywise` (batch
    invariance): the written-out attention one batch entry per call, as MKL's batched fp32
    matmul computes an entry differently in batches of different sizes."""
    if not softcap:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
    if entrywise and q.shape[0] > 1:
        masks = [None] * len(q) if mask is None else mask.split(1)
        return torch.cat(
            [
                sdpa(qi, ki, vi, mi, scale=scale, softcap=softcap, enable_gqa=enable_gqa)
                for qi, ki, vi, mi in zip(q.split(1), k.split(1), v.split(1), masks, strict=True)
            ]
        )
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    # Row by row: the tanh of a query's scores is then computed one way whatever else shares
    # the call (batch invariance).
    scores = rowwise(torch.tanh, scores / softcap) * softcap
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(
            k.shape[-2] - q.shape[-2]
        )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)
