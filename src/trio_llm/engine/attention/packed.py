"""Attention without a KV cache, for prefill-only (pooling) steps: every sequence of the packed
row attends over its own tokens only, bidirectionally for an encoder and causally for a decoder,
as the attention module itself says (`module.is_causal`).

transformers calls `packed_attention` in every attention layer of a model loaded with
`attn_implementation="trio_packed"` (`register_packed` makes that name loadable); the pooling
runner hands one step's `PackedAttentionMetadata` as the keyword argument `trio_attn`. Nothing
is written anywhere: a pooling engine keeps no K/V once its step is done.

Invariant: sequence b's tokens are rows `[cu_seqlens[b], cu_seqlens[b + 1])` of the row, and
no row attends across that boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

PACKED_IMPLEMENTATION = "trio_packed"


@dataclass(frozen=True, slots=True)
class PackedAttentionMetadata:
    bounds: list[tuple[int, int]]
    """Each sequence's rows [start, end) in the packed row."""


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    trio_attn: PackedAttentionMetadata | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The transformers attention interface: query [1, Hq, T, D], key/value [1, Hkv, T, D]
    -> ([1, T, Hq, D], no weights)."""
    if trio_attn is None:
        raise RuntimeError(
            "the trio_packed attention runs only inside the engine's pooling runner "
            "(the forward call lacks its trio_attn metadata)"
        )
    causal = bool(getattr(module, "is_causal", False))
    gqa = query.shape[1] != key.shape[1]
    out = query.new_empty(query.shape)
    for start, end in trio_attn.bounds:
        out[:, :, start:end] = F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            is_causal=causal,
            scale=scaling,
            enable_gqa=gqa,
        )
    return out.transpose(1, 2), None


def register_packed() -> None:
    """Make `attn_implementation="trio_packed"` loadable (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_IMPLEMENTATION, packed_attention)
