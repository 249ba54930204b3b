"""Writing each new token's K and V into its cache slot: one program per token."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from trio_llm.kernels._triton.tile import next_pow2


@triton.jit
def write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcb,
    stride_kct,
    stride_kch,
    stride_vcb,
    stride_vct,
    stride_vch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        block = slot // PAGE
        offset = slot % PAGE
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
        t64 = t.to(tl.int64)
        k = tl.load(key_ptr + t64 * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(value_ptr + t64 * stride_vt + h * stride_vh + d, mask=mask)
        k_dst = k_cache_ptr + block * stride_kcb + offset * stride_kct + h * stride_kch + d
        v_dst = v_cache_ptr + block * stride_vcb + offset * stride_vct + h * stride_vch + d
        tl.store(k_dst, k, mask=mask)
        tl.store(v_dst, v, mask=mask)


def write_kv(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    block_h, block_d = next_pow2(num_kv_heads, 1), next_pow2(head_dim)
    write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        PAGE=k_cache.shape[1],
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        # One token's K and V are small: spread them so each thread moves 16-byte vectors.
        num_warps=max(1, min(4, block_h * block_d // 256)),
    )
