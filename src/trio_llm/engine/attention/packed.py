"""Attention without a KV cache, for prefill-only (pooling) steps: every sequence of the packed
row attends over its own tokens only, bidirectionally for an encoder and causally for a decoder,
as the attention module itself says (`module.is_causal`).

transformers calls `packed_attention` in every attention layer of a model loaded with
`attn_implementation="trio_packed"` (`register_packed` makes that name loadable); the pooling
runner hands one step's `PackedAttentionMetadata` as the keyword argument `trio_attn`. Nothing
is written anywhere: a pooling engine keeps no K/V once its step is done.

How: one `scaled_dot_product_attention` call per run of neighbouring sequences of one length,
on views of the packed row. Measured on one core (T=1410, 53 inputs in 26 runs, one layer):
8-10 ms, against 22 ms for padded groups gathered with index_select (the gathers cost more
than the padding saved them).

Invariant: sequence b's tokens are rows `[cu_seqlens[b], cu_seqlens[b + 1])` of the row, and
no row attends across that boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

PACKED_IMPLEMENTATION = "trio_packed"


@dataclass(frozen=True, slots=True)
class PackedAttentionMetadata:
    runs: list[tuple[int, int, int]]
    """(first row, sequences, length): consecutive sequences of one length, attended as one
    batch [sequences, H, length, D] that is a view of the packed row (no copy, no padding)."""

    @classmethod
    def build(cls, cu_seqlens: np.ndarray) -> PackedAttentionMetadata:
        """Merge neighbours of equal length; the pooling runner lays a step's sequences out
        by length, so short inputs of one length (common) share one call."""
        runs: list[tuple[int, int, int]] = []
        for start, length in zip(cu_seqlens[:-1].tolist(), np.diff(cu_seqlens).tolist()):
            if runs and runs[-1][2] == length:
                first, count, _ = runs[-1]
                runs[-1] = (first, count + 1, length)
            else:
                runs.append((start, 1, length))
        return cls(runs)


def packed_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    trio_attn: PackedAttentionMetadata | None = None,
    **kwargs: object,
) -> tuple[Tensor, None]:
    """The transformers attention interface: query [1, Hq, T, D], key/value [1, Hkv, T, D]
    -> ([1, T, Hq, D], no weights)."""
    if trio_attn is None:
        raise RuntimeError(
            "the trio_packed attention runs only inside the engine's pooling runner "
            "(the forward call lacks its trio_attn metadata)"
        )
    causal = bool(getattr(module, "is_causal", False))
    heads, kv_heads = query.shape[1], key.shape[1]
    # [T, H, D]: transformers' query is a transposed view of exactly that layout, so a run of
    # rows is a batch view; slicing the [1, H, T, D] view instead handed SDPA strided inputs.
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    out = torch.empty_like(q)
    for run in trio_attn.runs:
        attended = F.scaled_dot_product_attention(
            _batch(q, run),
            _batch(k, run),
            _batch(v, run),
            is_causal=causal,
            scale=scaling,
            enable_gqa=heads != kv_heads,
        )  # [count, H, length, D]
        _batch(out, run).copy_(attended)
    return out.unsqueeze(0), None


def _batch(rows: Tensor, run: tuple[int, int, int]) -> Tensor:
    """A run's rows of `rows` ([T, H, D]) as the batch view [count, H, length, D]."""
    first, count, length = run
    chunk = rows[first : first + count * length]
    return chunk.view(count, length, *rows.shape[1:]).transpose(1, 2)


def register_packed() -> None:
    """Make `attn_implementation="trio_packed"` loadable (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_IMPLEMENTATION, packed_attention)
