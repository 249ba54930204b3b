"""What both attention backends share: the function transformers calls, and what it is handed.

transformers calls `paged_attention` in every attention layer of a model loaded with
`attn_implementation="trio_paged"` (`register` makes that name loadable); the model runner passes
one step's metadata as the keyword argument `trio_attn` of the model's forward, and transformers
forwards it to every layer. Each attention module carries its own `k_cache` / `v_cache` (set by
the model runner). The metadata's type is its backend: `paged_attention` calls its `forward`, so
nothing here switches on a backend's name.

A backend's metadata is built once per step from a `StepLayout`, the packed row as numpy arrays,
and holds what every layer needs (device tensors, gather indices, masks), so that each layer does
a few large tensor ops and no per-token Python.

Invariants of the packed row: the decode tokens come first (one per sequence), then the prefill
chunks; `slot_mapping[i]` is where token i's K/V go (block_id * block_size + offset), and the
K/V of every position a query attends to is in the cache by the time it attends (each backend
writes the new tokens before attending). Cache layout, shared with the Triton kernels: per layer
`[num_blocks, block_size, num_kv_heads, head_dim]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

ATTN_IMPLEMENTATION = "trio_paged"

ToDevice = Callable[[str, np.ndarray], torch.Tensor]
"""How a metadata builder puts one named array on the device: the model runner's staging
buffers (pinned memory, non-blocking copies; the name picks the buffer)."""


@dataclass(frozen=True, slots=True)
class StepLayout:
    """One step's packed row as the model runner lays it out, in numpy (int64 throughout)."""

    num_decodes: int
    """The first `num_decodes` sequences (and rows) are single-token decode queries."""
    block_tables: np.ndarray
    """[B, max_blocks]: each sequence's blocks in order, decodes first, padded with block 0."""
    cu_seqlens_q: np.ndarray
    """[B + 1]: sequence b's tokens are rows [cu_seqlens_q[b], cu_seqlens_q[b + 1])."""
    context_lens: np.ndarray
    """[B]: each sequence's K/V length, this step's tokens included."""
    slot_mapping: np.ndarray
    """[T]: where each new token's K/V go."""
    key_bucket: int = 0
    """0: each query attends over exactly its context. B > 0: every query, decode or prefill,
    attends as a decode does, over its context rounded up to a multiple of B (the rest
    masked), so that its attention depends neither on the batch nor on the path that computes
    it (batch invariance, engine/plans/invariance.py; torch backend only, the Triton kernels ignore
    it and the engine does not run them with invariance on)."""
    plain_attention: bool = False
    """Every layer of the model attends over its whole context with plain scores (no sliding
    window, no soft-cap): the torch backend may then run every query of the step as a decode
    of its own position on one kernel (AMX tiles)."""


class AttentionMetadata(Protocol):
    """One step's metadata of some backend: built once, read by every layer."""

    num_decodes: int

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Write this step's k, v ([T, Hkv, D]) into one layer's cache, then attend q ([T, Hq,
        D]) over it; [T, Hq, D] back. `window`: a sliding-window layer's (a query at position
        p sees the positions (p - window, p]); `softcap`: the layer caps its scores at
        `softcap * tanh(score / softcap)`. The caches' shapes may differ between layers."""
        ...


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    trio_attn: AttentionMetadata | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The transformers attention interface: query [1, Hq, T, D], key/value [1, Hkv, T, D]
    (rotary already applied) -> ([1, T, Hq, D], no weights).

    Of the keyword arguments a model's layers pass, `sliding_window` and `softcap` change the
    result and are honoured; the engine's start-up inspection
    (`engine/models/attention_layers.py`) refuses a model whose layers pass any other that would
    (attention sinks, a position bias, a mask of the model's own)."""
    if trio_attn is None:
        raise RuntimeError(
            "the trio_paged attention runs only inside the engine's model runner "
            "(the forward call lacks its trio_attn metadata)"
        )
    k_cache: torch.Tensor = module.k_cache  # type: ignore[assignment]
    v_cache: torch.Tensor = module.v_cache  # type: ignore[assignment]
    scale = module.scaling if scaling is None else scaling
    out = trio_attn.forward(
        query[0].transpose(0, 1),  # [T, Hq, D]
        key[0].transpose(0, 1),  # [T, Hkv, D]
        value[0].transpose(0, 1),
        k_cache,
        v_cache,
        scale,
        window=kwargs.get("sliding_window"),  # type: ignore[arg-type]
        softcap=kwargs.get("softcap"),  # type: ignore[arg-type]
    )
    return out.unsqueeze(0), None


def decodes_then_prefills(
    q: torch.Tensor,
    num_decodes: int,
    decode: Callable[[torch.Tensor], torch.Tensor],
    prefill: Callable[[torch.Tensor, torch.Tensor], None],
) -> torch.Tensor:
    """Attention over the packed row in its two parts: `decode(q[:num_decodes])` returns the
    decode rows' output, `prefill(q[num_decodes:], out)` writes the rest into `out`."""
    if num_decodes == q.shape[0]:
        return decode(q)
    out = q.new_empty(q.shape)
    if num_decodes:
        out[:num_decodes] = decode(q[:num_decodes])
    prefill(q[num_decodes:], out[num_decodes:])
    return out


def register() -> None:
    """Make `attn_implementation="trio_paged"` loadable (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)


def as_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """numpy fancy indexing may hand back a strided array; the attention views need rows."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)
