"""The torch backend's per-step plans: what every layer's attention needs that depends on the
step but not on the layer, computed once per step from the block tables and lengths.

A decode's plan says which blocks each sequence gathers and which positions are masked; a
prefill chunk's, which cache slots hold its context; with batch invariance on, the bucketed
plans lay every query out as a decode of its own (torch_backend.py's ops consume them all).
Why apart from the ops: the plans are numpy arithmetic on the host, made once a step; the ops
are tensor work, run by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from trio_llm.engine.attention.interface import as_tensor


@dataclass(frozen=True, slots=True)
class InPlace:
    """What the in-place decode kernel reads: the tables and lengths as they are."""

    block_tables: Tensor
    """[B, W] int64."""
    context_lens: Tensor
    """[B] int64."""
    window: int
    """A sliding-window layer's window (0: none)."""
    amx: bool = False
    """Run on the bf16 kernel (ops/paged_amx.py: AMX tiles, or AVX512-BF16 where AMX is absent)
    instead of the float one, where the layer does not soft-cap its scores or slide a window:
    every query of the step is one of its rows."""
    split: bool = False
    """On the bf16 kernel, the probabilities in two bf16 parts (batch invariance on AMX, whose
    quantized matmuls round activations to int8 already, and the attention keeps the float
    kernel's precision rather than SDPA's; `paged_amx.splits_for_invariance`)."""


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
    in_place: InPlace | None = None
    """Set when the decodes read the cache where it lies (ops/paged_decode.py) rather than
    through the gather: then `blocks`, `mask` and `buffers` are empty."""

    @classmethod
    def build(
        cls,
        block_tables: np.ndarray,
        context_lens: np.ndarray,
        cache: Tensor,
        length: int | None = None,
        window: int = 0,
        in_place: bool = False,
        amx: bool = False,
        split: bool = False,
    ) -> DecodePlan:
        """`cache`: one layer's K (or V) cache; every layer's has its shape, dtype and device.
        `length`: attend over this many positions (masking those past each context) rather
        than over the longest context, and always through a mask. `window` > 0: each query
        sees only the last `window` positions (a sliding-window layer); without a fixed
        `length`, only the blocks that hold them are gathered. `in_place` (without a fixed
        `length`): a plan for the in-place kernel, which needs no gather; `amx`: on the bf16
        one (AMX or AVX512-BF16), `split` as `InPlace` says."""
        device = cache.device
        if in_place and length is None:
            nothing = torch.empty(0, dtype=torch.int64, device=device)
            return cls(
                blocks=nothing,
                length=int(context_lens.max(initial=0)),
                mask=None,
                empty=None,
                buffers=(nothing, nothing),
                in_place=InPlace(
                    as_tensor(block_tables.astype(np.int64, copy=False), device),
                    as_tensor(context_lens.astype(np.int64, copy=False), device),
                    window,
                    amx,
                    split,
                ),
            )
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


def queries_as_decodes(
    block_tables: np.ndarray, cu_seqlens_q: np.ndarray, context_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Batch invariance on the in-place decode kernel: each query of the step as a decode of its
    own, the query at position p over its sequence's blocks with context p + 1 (a decode's
    query is its sequence's last position). The kernel computes a query from its own context
    alone, so a token's row is the same bits whether a decode, a prefill chunk of any size or a
    recompute computes it, and no key bucket is needed. Returns the per-query (block tables,
    context lengths)."""
    counts = np.diff(cu_seqlens_q)
    tables = np.repeat(block_tables, counts, axis=0)
    # Query i of a sequence of n this step, at context length L: position L - n + i.
    offsets = np.arange(int(counts.sum())) - np.repeat(cu_seqlens_q[:-1], counts)
    lens = np.repeat(context_lens - counts, counts) + offsets + 1
    return tables, lens
