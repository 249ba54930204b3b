"""The torch attention backend: the CPU hot path, on `F.scaled_dot_product_attention`.

It implements the contract of the Triton kernels (`trio_llm.kernels`), with their call
signatures: `write_kv`, `decode_attention` and `prefill_attention` here take the same arguments
and give the same results, and tests/kernels runs them on the same cases against the same
references (`trio_llm.kernels.reference`). The references define the contract obviously (a Python
loop over sequences, fp32 einsums); this is the fast implementation of it.

What is fast about it: everything that depends on the step but not on the layer (which blocks
each decode gathers, the masks, the gather buffers, each prefill chunk's context slots) is a plan
built once per step by `TorchAttentionMetadata.build`; each layer then runs `_store`, `_decode`
and `_prefill` on the plans, a handful of large tensor ops. The kernel-signature functions build
the same plans from their arguments on every call (what tests and one-off callers want).

Why over 400 lines: the step plans and the three ops that consume them share private layouts
(gather buffers, chunk slots, windows, key buckets); the kernel-signature wrappers are a
thin tail that tests read beside them.
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
from trio_llm.engine.invariance import rowwise


@dataclass(slots=True)
class DecodePlan:
    """What every layer's decode needs, for a batch of one-query sequences."""

    blocks: Tensor
    """[B * N] int64: each sequence's first N blocks, where N blocks cover the longest context;
    a sequence's entries past its own blocks point at block 0 (masked out)."""
    length: int
    """The longest context: positions past it in the gathered blocks are dropped."""
    mask: Tensor | None
    """[B, 1, 1, length] bool: True where a position is within its sequence's context; None
    when every context has the same length."""
    empty: Tensor | None
    """[B] bool: sequences with context 0 (batch padding), whose output is zeros; None when
    there are none (always, in the engine)."""
    buffers: tuple[Tensor, Tensor]
    """[B * N, block_size * Hkv * D] scratch for the gathered keys and values, shared by every
    layer of the step (no allocation, no page faults per layer)."""

    @classmethod
    def build(
        cls,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        cache: Tensor,
        length: int | None = None,
        window: int = 0,
    ) -> DecodePlan:
        """`cache`: one layer's K (or V) cache; every layer's has its shape, dtype and device.
        `length`: attend over this many positions (masking those past each context) rather
        than over the longest context, and always through a mask. `window` > 0: each query
        sees only the last `window` positions (a sliding-window layer); without a fixed
        `length`, only the blocks that hold them are gathered."""
        device = cache.device
        block_size = cache.shape[1]
        fixed = length is not None
        if length is None:
            length = int(context_lens.max(initial=0))
        needed = -(-context_lens // block_size)
        first = np.zeros_like(context_lens)
        """Each sequence's first gathered block (its window's, when one skips blocks)."""
        if window and not fixed and length > window:
            first = np.maximum(context_lens - window, 0) // block_size
            length = min(length, ((window - 1) // block_size + 2) * block_size)
        num_blocks = -(-length // block_size)
        if block_tables.shape[1] < num_blocks:  # a fixed length past every table's end
            block_tables = np.pad(block_tables, ((0, 0), (0, num_blocks - block_tables.shape[1])))
        columns = first[:, None] + np.arange(num_blocks)[None, :]
        blocks = np.where(
            columns < needed[:, None],
            np.take_along_axis(block_tables, np.minimum(columns, block_tables.shape[1] - 1), 1),
            0,
        )
        width = cache[0].numel()
        rows = len(context_lens) * num_blocks
        mask = empty = None
        positions = first[:, None] * block_size + np.arange(length)[None, :]
        windowed = bool(window) and bool((context_lens > window).any())
        if fixed or windowed or (context_lens != length).any():
            visible = positions < context_lens[:, None]
            if windowed:
                visible &= positions >= (context_lens - window)[:, None]
            mask = as_tensor(visible[:, None, None, :], device)
        if (context_lens == 0).any():
            empty = as_tensor(context_lens == 0, device)
        return cls(
            blocks=as_tensor(blocks.reshape(-1).astype(np.int64), device),
            length=length,
            mask=mask,
            empty=empty,
            buffers=(
                torch.empty(rows, width, dtype=cache.dtype, device=device),
                torch.empty(rows, width, dtype=cache.dtype, device=device),
            ),
        )


@dataclass(slots=True)
class PrefillChunk:
    """One sequence's chunk of queries."""

    start: int
    end: int
    """Its queries are rows [start, end) of the prefill queries."""
    context_slots: Tensor
    """[context] int64: the cache slots of all its positions up to the chunk's end."""
    mask: Tensor | None
    """[chunk, context] bool causal mask offset by the earlier positions, when there are any (a
    later chunk, or a prefix-cache hit); None when the chunk is the whole context."""


@dataclass(slots=True)
class BucketedQueries:
    """Queries of one sequence whose contexts round up to the same bucket: each attends as a
    decode with that context does (its own batch entry, `length` keys, the rest masked)."""

    start: int
    end: int
    """Rows [start, end) of the prefill queries."""
    length: int
    mask: Tensor
    """[end - start, 1, 1, length] bool: each query's positions up to its own."""


@dataclass(slots=True)
class BucketedChunk:
    """One sequence's chunk with key buckets: its context gathered once, then its queries in
    groups by bucket."""

    context_slots: Tensor
    """[longest bucket] int64: the cache slots of its positions; slot 0 past its context."""
    groups: list[BucketedQueries]


def plan_prefill(
    block_tables: np.ndarray,
    cu_seqlens_q: np.ndarray,
    context_lens: np.ndarray,
    block_size: int,
    device: torch.device,
    window: int = 0,
) -> list[PrefillChunk]:
    """One chunk per sequence with queries and context (the others' queries get zeros).

    With `window` W > 0 (a sliding-window layer), the query at position p sees only the
    positions (p - W, p], and the chunk's context starts at its first query's window."""
    chunks = []
    for b, ctx in enumerate(context_lens.tolist()):
        start, end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        if start == end or ctx == 0:
            continue
        earlier = ctx - (end - start)
        windowed = bool(window) and ctx > window
        j = np.arange(max(earlier - window + 1, 0) if windowed else 0, ctx)
        slots = block_tables[b, j // block_size].astype(np.int64) * block_size + j % block_size
        mask = None
        if earlier or windowed:
            q_pos = np.arange(earlier, ctx)
            visible = j[None, :] <= q_pos[:, None]
            if windowed:
                visible &= j[None, :] > q_pos[:, None] - window
            mask = as_tensor(visible, device)
        chunks.append(PrefillChunk(start, end, as_tensor(slots, device), mask))
    return chunks


def plan_bucketed_prefill(
    block_tables: np.ndarray,
    cu_seqlens_q: np.ndarray,
    context_lens: np.ndarray,
    block_size: int,
    device: torch.device,
    key_bucket: int,
    window: int = 0,
) -> list[BucketedChunk]:
    """Batch invariance's prefill: the query at position p attends over positions
    [0, roundup(p + 1, key_bucket)) with those past p (and, with a sliding `window` W, those
    up to p - W) masked, in a batch entry of its own, which is exactly what a decode at
    position p computes (`DecodePlan` with a fixed length). So a token's row is the same
    whether a decode, a prefill chunk of any size, a recompute after a preemption or a draft
    chunk computes it."""
    chunks = []
    for b, ctx in enumerate(context_lens.tolist()):
        start, end = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        if start == end or ctx == 0:
            continue
        earlier = ctx - (end - start)
        longest = -(-ctx // key_bucket) * key_bucket
        j = np.arange(longest)
        real = j < ctx
        blocks = block_tables[b, np.where(real, j, 0) // block_size].astype(np.int64)
        slots = np.where(real, blocks * block_size + j % block_size, 0)
        groups = []
        first = earlier
        while first < ctx:
            length = (first // key_bucket + 1) * key_bucket
            last = min(length, ctx)  # positions [first, last) share this bucket
            q_pos = np.arange(first, last)
            visible = j[None, :length] <= q_pos[:, None]
            if window:
                visible &= j[None, :length] > q_pos[:, None] - window
            groups.append(
                BucketedQueries(
                    start + first - earlier,
                    start + last - earlier,
                    length,
                    as_tensor(visible[:, None, None, :], device),
                )
            )
            first = last
        chunks.append(BucketedChunk(as_tensor(slots, device), groups))
    return chunks


@dataclass(slots=True)
class TorchAttentionMetadata:
    """One step of the torch backend: the slots to write and the plans every layer reads."""

    slot_mapping: Tensor
    """[T] int64, never negative (the engine does not pad)."""
    num_decodes: int
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
        if nd and bucket:
            lengths = -(-lens[:nd] // bucket) * bucket
            for length in np.unique(lengths).tolist():
                rows = np.flatnonzero(lengths == length)
                plan = DecodePlan.build(
                    tables[rows], lens[rows], cache, length=length, window=window
                )
                meta.decode_groups.append((as_tensor(rows, device), plan))
        elif nd:
            meta.decode = DecodePlan.build(tables[:nd], lens[:nd], cache, window=window)
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
        _store(k, v, k_cache, v_cache, plans.slot_mapping)
        nd = plans.num_decodes

        def decode(qd: Tensor) -> Tensor:
            if plans.decode is not None:
                return _decode(qd, k_cache, v_cache, plans.decode, scale, softcap)
            out = qd.new_empty(qd.shape)
            for rows, plan in plans.decode_groups:
                out[rows] = _decode(
                    qd.index_select(0, rows), k_cache, v_cache, plan, scale, softcap, entrywise=True
                )
            return out

        def prefill(qp: Tensor, out: Tensor) -> None:
            if plans.bucketed:
                _prefill_as_decodes(qp, k_cache, v_cache, plans.bucketed, scale, out, softcap)
                return
            fresh = (k[nd:], v[nd:]) if plans.fresh_kv else None
            _prefill(qp, k_cache, v_cache, plans.prefills, scale, out, fresh, softcap)

        return decodes_then_prefills(q, nd, decode, prefill)


# -- the kernels' signatures ------------------------------------------------------------------


def write_kv(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Store token t's `key[t]`, `value[t]` (`[T, Hkv, D]`) at cache slot `slot_mapping[t]`;
    a slot < 0 marks a padding token and is skipped."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    _store(key, value, k_cache, v_cache, slot_mapping.long())


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
) -> Tensor:
    """One query token per sequence (`q`: `[B, Hq, D]`) over its `context_lens[b]` cached
    tokens, the new token's own K/V included. Returns `[B, Hq, D]` in q's dtype; a sequence with
    context 0 (batch padding) gets zeros."""
    plan = DecodePlan.build(_numpy(block_tables), _numpy(context_lens), k_cache)
    return _decode(q, k_cache, v_cache, plan, scale)


def prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    context_lens: Tensor,
    scale: float,
) -> Tensor:
    """Causal attention for packed query chunks (`q`: `[T, Hq, D]`): sequence b's queries are
    `q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`, its K/V (cached prefix plus this chunk, already
    written) are `context_lens[b]` long, and its query i at position
    `context_lens[b] - q_len_b + i` sees the positions up to its own. Returns `[T, Hq, D]`."""
    chunks = plan_prefill(
        _numpy(block_tables), _numpy(cu_seqlens_q), _numpy(context_lens), k_cache.shape[1], q.device
    )
    out = torch.zeros_like(q)
    _prefill(q, k_cache, v_cache, chunks, scale, out)
    return out


def _numpy(t: Tensor) -> np.ndarray:
    return t.cpu().numpy().astype(np.int64, copy=False)


# -- what every layer runs ----------------------------------------------------------------------


def _rows(cache: Tensor) -> Tensor:
    """The cache as rows of [Hkv * D], one per slot: index_copy_ and index_select over 2-D rows
    are many times faster than over 3-D."""
    return cache.view(cache.shape[0] * cache.shape[1], -1)


def _store(key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor) -> None:
    """`write_kv` for int64 slots that are all valid (no padding)."""
    num_tokens = slots.shape[0]
    _rows(k_cache).index_copy_(0, slots, key.reshape(num_tokens, -1))
    _rows(v_cache).index_copy_(0, slots, value.reshape(num_tokens, -1))


def _decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: DecodePlan,
    scale: float,
    softcap: float | None = None,
    *,
    entrywise: bool = False,
) -> Tensor:
    """One query per sequence, [B, Hq, D], over each sequence's blocks. `entrywise`: see
    `_sdpa`."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if plan.length == 0:
        return q.new_zeros(q.shape)
    k_buf, v_buf = plan.buffers
    # Whole blocks (rows of block_size * Hkv * D) copy faster than token rows.
    torch.index_select(k_cache.view(k_cache.shape[0], -1), 0, plan.blocks, out=k_buf)
    torch.index_select(v_cache.view(v_cache.shape[0], -1), 0, plan.blocks, out=v_buf)
    kd = k_buf.view(batch, -1, num_kv_heads, head_dim)[:, : plan.length].transpose(1, 2)
    vd = v_buf.view(batch, -1, num_kv_heads, head_dim)[:, : plan.length].transpose(1, 2)
    # The query heads sharing a KV head become that head's query rows ([B, Hkv, group, D]):
    # no KV head is repeated, and with one query per sequence no mask is causal.
    qd = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = _sdpa(qd, kd, vd, plan.mask, scale=scale, softcap=softcap, entrywise=entrywise)
    out = out.reshape(batch, num_heads, head_dim)
    if plan.empty is not None:
        out[plan.empty] = 0
    return out


def _prefill(
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
        attended = _sdpa(
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
    """Each chunk's queries as `_decode` computes a decode: [n, Hkv, group, D] queries, each
    over its own batch entry of `length` keys (the chunk's context, shared, not copied)."""
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
            attended = _sdpa(
                q[g.start : g.end].reshape(n, num_kv_heads, group, head_dim),
                kc[:, : g.length].expand(n, -1, -1, -1),
                vc[:, : g.length].expand(n, -1, -1, -1),
                g.mask,
                scale=scale,
                softcap=softcap,
                entrywise=True,
            )
            out[g.start : g.end] = attended.reshape(n, num_heads, head_dim)


def _sdpa(
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
                _sdpa(qi, ki, vi, mi, scale=scale, softcap=softcap, enable_gqa=enable_gqa)
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
