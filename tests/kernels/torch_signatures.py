"""The torch attention backend behind the kernels' three call signatures, so the kernel tests
run it on the kernels' own cases: each call builds the plans the engine builds once per step
(torch_plans.py) from the call's arguments, then runs the backend's ops on them."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from trio_llm.engine.attention import torch_backend
from trio_llm.engine.attention.torch_plans import DecodePlan, plan_prefill
from trio_llm.engine.ops import paged_decode


def _numpy(t: Tensor) -> np.ndarray:
    return t.cpu().numpy().astype(np.int64, copy=False)


def write_kv(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Store token t's `key[t]`, `value[t]` at cache slot `slot_mapping[t]`; a slot < 0 marks
    a padding token and is skipped."""
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    torch_backend.store_kv(key, value, k_cache, v_cache, slot_mapping.long())


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    *,
    in_place: bool = False,
) -> Tensor:
    """`in_place`: the in-place C++ kernel's plan (ops/paged_decode.py) instead of the gather
    and SDPA, where the kernel takes the layer (as the engine decides)."""
    plan = DecodePlan.build(
        _numpy(block_tables),
        _numpy(context_lens),
        k_cache,
        in_place=in_place and paged_decode.supports(k_cache),
    )
    return torch_backend.decode_on_plan(q, k_cache, v_cache, plan, scale)


def prefill_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    context_lens: Tensor,
    scale: float,
) -> Tensor:
    chunks = plan_prefill(
        _numpy(block_tables), _numpy(cu_seqlens_q), _numpy(context_lens), k_cache.shape[1], q.device
    )
    out = torch.zeros_like(q)
    torch_backend.prefill_on_plans(q, k_cache, v_cache, chunks, scale, out)
    return out
