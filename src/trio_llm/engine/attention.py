"""Paged attention: the function transformers calls in every attention layer of a loaded model.

What it owns: writing each step's new keys and values into the paged KV cache and attending over
every sequence's blocks, for one packed row of tokens (all scheduled tokens of all sequences).
The model runner builds one `AttentionMetadata` per step and passes it as a keyword argument of
the model's forward; transformers forwards it to this function in every layer, and each attention
module carries its own `k_cache` / `v_cache` (set by the model runner).

Invariants: the packed row holds the decode tokens first (one per sequence), then the prefill
chunks; `slot_mapping[i]` is where token i's K/V go (block_id * block_size + offset), and the
K/V of every position a query attends to is in the cache by the time it attends (new tokens are
written before attending).

Cache layout, shared with the Triton kernels: per layer `[num_blocks, block_size, num_kv_heads,
head_dim]`. The torch path is the CPU hot path: everything that does not depend on the layer
(gather indices, masks) is built once per step in the metadata, so each of the model's layers
does a handful of large tensor ops and no per-token Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "trio_paged"


@dataclass(slots=True)
class PrefillChunk:
    """One sequence's prefill chunk in the packed row (torch path)."""

    start: int
    end: int
    """Rows [start, end) of the packed row."""
    context_slots: torch.Tensor | None
    """Cache slots of all the sequence's positions up to the chunk's end, when earlier positions
    exist (a later chunk, or a prefix-cache hit); None when the chunk is the whole context."""
    mask: torch.Tensor | None
    """[chunk, context] causal mask offset by the earlier positions; None with no context."""


@dataclass(slots=True)
class AttentionMetadata:
    """What every layer needs to attend in one step; built once per step."""

    backend: str
    """'torch' or 'triton'."""
    slot_mapping: torch.Tensor
    """[T] int64: where each new token's K/V go."""
    num_decodes: int
    """The first `num_decodes` rows are single-token (decode) queries, one per sequence."""
    scale: float = 1.0
    # torch path
    decode_blocks: torch.Tensor | None = None
    """[num_decodes * B] int64: each decode sequence's first B blocks (padded with block 0),
    where B blocks cover the longest decode context."""
    decode_len: int = 0
    """The longest decode context: positions past it in the gathered blocks are dropped."""
    decode_mask: torch.Tensor | None = None
    """[num_decodes, 1, 1, decode_len] bool: True where a position is within its sequence's
    context; None when every decode context has the same length."""
    decode_buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    """[num_decodes * B, block_size * Hkv * D] scratch for the gathered keys and values,
    shared by every layer of the step (no allocation, no page faults per layer)."""
    prefills: list[PrefillChunk] = field(default_factory=list)
    # triton path
    block_tables: torch.Tensor | None = None
    """[B, max_blocks] int32, decodes first."""
    context_lens: torch.Tensor | None = None
    """[B] int32: K/V length of each sequence including this step's tokens."""
    cu_seqlens_q: torch.Tensor | None = None
    """[num_prefills + 1] int32: prefill chunk boundaries, relative to row `num_decodes`."""


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
    (rotary already applied) -> ([1, T, Hq, D], no weights)."""
    if trio_attn is None:
        raise RuntimeError(
            "the trio_paged attention runs only inside the engine's model runner "
            "(the forward call lacks its trio_attn metadata)"
        )
    meta = trio_attn
    k_cache: torch.Tensor = module.k_cache  # type: ignore[assignment]
    v_cache: torch.Tensor = module.v_cache  # type: ignore[assignment]
    scale = module.scaling if scaling is None else scaling
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    k = key[0].transpose(0, 1)  # [T, Hkv, D]
    v = value[0].transpose(0, 1)
    if meta.backend == "triton":
        out = _triton_attention(q, k, v, k_cache, v_cache, meta, scale)
    else:
        out = _torch_attention(q, k, v, k_cache, v_cache, meta, scale)
    return out.unsqueeze(0), None


def _torch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    num_tokens = q.shape[0]
    # Rows of [Hkv * D]: index_copy_/index_select over 2-D rows are many times faster than
    # over 3-D.
    k_rows = k_cache.view(k_cache.shape[0] * k_cache.shape[1], -1)
    v_rows = v_cache.view(v_cache.shape[0] * v_cache.shape[1], -1)
    k_rows.index_copy_(0, meta.slot_mapping, k.reshape(num_tokens, -1))
    v_rows.index_copy_(0, meta.slot_mapping, v.reshape(num_tokens, -1))
    nd = meta.num_decodes
    if nd == num_tokens:
        return _decode(q, k_cache, v_cache, meta, scale)
    out = q.new_empty(q.shape)
    if nd:
        out[:nd] = _decode(q[:nd], k_cache, v_cache, meta, scale)
    for chunk in meta.prefills:
        out[chunk.start : chunk.end] = _prefill(q, k, v, k_rows, v_rows, chunk, scale)
    return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """One query per sequence, [B, Hq, D], over each sequence's blocks."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    assert meta.decode_blocks is not None and meta.decode_buffers is not None
    k_buf, v_buf = meta.decode_buffers
    # Whole blocks (rows of block_size * Hkv * D) copy faster than token rows.
    torch.index_select(k_cache.view(k_cache.shape[0], -1), 0, meta.decode_blocks, out=k_buf)
    torch.index_select(v_cache.view(v_cache.shape[0], -1), 0, meta.decode_blocks, out=v_buf)
    kd = k_buf.view(batch, -1, num_kv_heads, head_dim)[:, : meta.decode_len].transpose(1, 2)
    vd = v_buf.view(batch, -1, num_kv_heads, head_dim)[:, : meta.decode_len].transpose(1, 2)
    # The query heads sharing a KV head become that head's query rows ([B, Hkv, group, D]):
    # no KV head is repeated, and with one query per sequence no mask is causal.
    qd = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale)
    return out.reshape(batch, num_heads, head_dim)


def _prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_rows: torch.Tensor,
    v_rows: torch.Tensor,
    chunk: PrefillChunk,
    scale: float,
) -> torch.Tensor:
    """One sequence's chunk of queries, causal over its earlier positions and the chunk."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k.shape[1]
    if chunk.context_slots is None:  # the chunk is the whole context: no gather
        kc = k[chunk.start : chunk.end]
        vc = v[chunk.start : chunk.end]
    else:
        kc = k_rows.index_select(0, chunk.context_slots).view(-1, num_kv_heads, head_dim)
        vc = v_rows.index_select(0, chunk.context_slots).view(-1, num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(
        q[chunk.start : chunk.end].transpose(0, 1).unsqueeze(0),  # [1, Hq, n, D]
        kc.transpose(0, 1).unsqueeze(0),
        vc.transpose(0, 1).unsqueeze(0),
        attn_mask=chunk.mask,
        is_causal=chunk.mask is None,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return out[0].transpose(0, 1)


def _triton_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    from trio_llm.kernels import decode_attention, prefill_attention, write_kv

    assert meta.block_tables is not None and meta.context_lens is not None
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decodes
    if nd == q.shape[0]:
        return decode_attention(
            q.contiguous(), k_cache, v_cache, meta.block_tables, meta.context_lens, scale
        )
    out = q.new_empty(q.shape)
    if nd:
        out[:nd] = decode_attention(
            q[:nd].contiguous(),
            k_cache,
            v_cache,
            meta.block_tables[:nd],
            meta.context_lens[:nd],
            scale,
        )
    assert meta.cu_seqlens_q is not None
    out[nd:] = prefill_attention(
        q[nd:].contiguous(),
        k_cache,
        v_cache,
        meta.block_tables[nd:],
        meta.cu_seqlens_q,
        meta.context_lens[nd:],
        scale,
    )
    return out


def triton_available() -> bool:
    try:
        from trio_llm.kernels import triton_available
    except ImportError:
        return False
    return triton_available()


def resolve_backend(backend: str, device: str) -> str:
    """`auto`: the Triton kernels on CUDA when Triton is installed, the torch path otherwise.
    `triton` on a CPU runs the kernels in Triton's interpreter: slow, but it tests the dispatch."""
    if backend == "auto":
        return "triton" if device.startswith("cuda") and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("attention_backend 'triton' asked for, but Triton is not installed")
    elif backend != "torch":
        raise ValueError(f"unknown attention_backend {backend!r}; use auto, torch or triton")
    return backend


def register() -> None:
    """Make `attn_implementation="trio_paged"` loadable (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
