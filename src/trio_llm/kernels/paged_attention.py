"""Paged attention entry points the engine calls: write K/V by slot, decode, prefill.

The KV cache of one layer is a pair `k_cache`, `v_cache`, each `[num_blocks, block_size, Hkv, D]`;
slot `s` is block `s // block_size`, offset `s % block_size`. A sequence's block table row lists
its blocks in order, so its token `pos` lives in slot `block_tables[b, pos // block_size] *
block_size + pos % block_size`.

These functions check shapes and dtypes (never values: reading a device tensor would stall the
stream and break graph capture) and run the Triton kernels. Values the caller guarantees:
every block id a sequence reaches is a valid block, `context_lens[b] >= q_len_b` (the chunk's own
K/V are already written), and `block_tables` is at least `ceil(context_lens[b] / block_size)`
wide. The torch references (`*_ref`, re-exported here) define the same functions; the tests
compare the kernels against them, and the engine's torch backend too, which has these signatures.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trio_llm.kernels._config import DecodeConfig, PrefillConfig
from trio_llm.kernels._loader import load_triton
from trio_llm.kernels.reference import decode_attention_ref, prefill_attention_ref, write_kv_ref

__all__ = [
    "decode_attention",
    "decode_attention_ref",
    "prefill_attention",
    "prefill_attention_ref",
    "write_kv",
    "write_kv_ref",
]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INDICES = (torch.int32, torch.int64)


def _check_cache(k_cache: Tensor, v_cache: Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.dtype not in _FLOATS or v_cache.dtype != k_cache.dtype:
        raise TypeError(f"caches must share one of {_FLOATS}, got {k_cache.dtype}/{v_cache.dtype}")
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("the caches' head_dim axis must be contiguous (stride 1)")


def _check_index(name: str, t: Tensor, shape: tuple[int, ...] | None, device: torch.device) -> None:
    if t.dtype not in _INDICES:
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the cache on {device}")


def _check_query(q: Tensor, k_cache: Tensor) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [tokens, num_heads, head_dim], got {tuple(q.shape)}")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if q.shape[2] != head_dim:
        raise ValueError(f"q's head_dim {q.shape[2]} differs from the cache's {head_dim}")
    if q.shape[1] % num_kv_heads:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {num_kv_heads} KV heads")
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q is {q.dtype} but the cache is {k_cache.dtype}")
    if q.device != k_cache.device:
        raise ValueError(f"q is on {q.device}, the cache on {k_cache.device}")


def _unit_last_stride(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def write_kv(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Store token t's `key[t]`, `value[t]` (`[T, Hkv, D]`) at cache slot `slot_mapping[t]`;
    a slot < 0 marks a padding token and is skipped."""
    _check_cache(k_cache, v_cache)
    expected = (slot_mapping.shape[0], k_cache.shape[2], k_cache.shape[3])
    if tuple(key.shape) != expected or tuple(value.shape) != expected:
        raise ValueError(
            f"key and value must be {expected} (tokens, kv heads, head dim), "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if key.dtype != k_cache.dtype or value.dtype != k_cache.dtype:
        raise TypeError(f"key/value are {key.dtype}/{value.dtype}, the cache is {k_cache.dtype}")
    _check_index("slot_mapping", slot_mapping, None, k_cache.device)
    load_triton().write_kv(
        _unit_last_stride(key), _unit_last_stride(value), k_cache, v_cache, slot_mapping
    )


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    *,
    config: DecodeConfig | None = None,
) -> Tensor:
    """One query token per sequence (`q`: `[B, Hq, D]`) over its `context_lens[b]` cached
    tokens, the new token's own K/V included. Returns `[B, Hq, D]` in q's dtype; a sequence with
    context 0 (batch padding) gets zeros.

    `config` overrides the launch shape `decode_config` picks; it is for tests and benchmarks."""
    _check_cache(k_cache, v_cache)
    _check_query(q, k_cache)
    batch = q.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [{batch}, max_blocks], got {block_tables.shape}")
    _check_index("block_tables", block_tables, None, q.device)
    _check_index("context_lens", context_lens, (batch,), q.device)
    return load_triton().decode_attention(
        _unit_last_stride(q),
        k_cache,
        v_cache,
        _unit_last_stride(block_tables),
        context_lens,
        scale,
        config,
    )


def prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    context_lens: Tensor,
    scale: float,
    *,
    config: PrefillConfig | None = None,
) -> Tensor:
    """Causal attention for packed query chunks (`q`: `[T, Hq, D]`): sequence b's queries are
    `q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`, its K/V (cached prefix plus this chunk, already
    written) are `context_lens[b]` long, and its query i at position
    `context_lens[b] - q_len_b + i` sees the positions up to its own. Returns `[T, Hq, D]`.

    `config` overrides the default launch shape; it is for tests and benchmarks."""
    _check_cache(k_cache, v_cache)
    _check_query(q, k_cache)
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q must be [B + 1], got {tuple(cu_seqlens_q.shape)}")
    batch = cu_seqlens_q.shape[0] - 1
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [{batch}, max_blocks], got {block_tables.shape}")
    _check_index("cu_seqlens_q", cu_seqlens_q, None, q.device)
    _check_index("block_tables", block_tables, None, q.device)
    _check_index("context_lens", context_lens, (batch,), q.device)
    return load_triton().prefill_attention(
        _unit_last_stride(q),
        k_cache,
        v_cache,
        _unit_last_stride(block_tables),
        cu_seqlens_q,
        context_lens,
        scale,
        config,
    )
