"""Launch shapes for the Triton attention kernels, and the heuristic that picks decode's.

Kept free of Triton so callers can name and build configs on machines without it. Invariant: the
choice depends on tensor shapes and the device's SM count only, never on tensor values, so it
needs no device sync and is stable under CUDA graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of decode attention. `decode_config` picks one from the problem's shape."""

    block_n: int = 64
    """Cache tokens per tile (any power of two >= 16; independent of the cache block size)."""
    num_splits: int = 1
    """Chunks the context is split into (flash-decoding); 1 skips the reduce kernel."""
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class PrefillConfig:
    """Launch shape of prefill attention."""

    block_m: int = 128
    """Rows (query token x query head of one KV group) per program; a power of two >= 16."""
    block_n: int = 64
    num_warps: int = 8
    num_stages: int = 2


_SM_COUNT: dict[int, int] = {}
# Without a GPU the heuristics still pick what an H200 (132 SMs) would, so CPU tests exercise the
# same launch shapes the device takes.
_DEFAULT_SM_COUNT = 132
# Programs wanted per SM. About 8 bf16 decode programs fit on an sm_90 SM at once (58 registers
# x 128 threads, 20 KB of shared memory each, per bench/gpu/attention_kernels.py's compile report),
# so 16 is two full waves: a program's work is one context chunk, all about equal, and the last
# wave is never a small remainder. Checked on an H200 (bench/results/attention_kernels.md, the
# sweep): at both target points this default was within 4% of the best of 18 launch shapes.
_PROGRAMS_PER_SM = 16
_MIN_SPLIT_TOKENS = 128
MAX_SPLITS = 64


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return _DEFAULT_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNT:
        _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNT[index]


def decode_config(
    batch: int, num_kv_heads: int, max_context: int, device: torch.device
) -> DecodeConfig:
    """Split the context only as far as it takes to give the SMs several waves of programs
    (batch x KV heads x splits), never into chunks under _MIN_SPLIT_TOKENS: below that, writing
    and merging the fp32 partials costs more than the parallelism buys. `max_context` is the
    block table's capacity (width x block size), not the longest live context, so the choice
    never reads a device tensor."""
    base = max(1, batch * num_kv_heads)
    wanted = -(-_PROGRAMS_PER_SM * _sm_count(device) // base)
    by_length = max(1, -(-max_context // _MIN_SPLIT_TOKENS))
    return DecodeConfig(num_splits=max(1, min(wanted, by_length, MAX_SPLITS)))


def prefill_config(dtype: torch.dtype) -> PrefillConfig:
    """128-row tiles with 8 warps feed Hopper's wgmma for 16-bit inputs. fp32 inputs take ieee
    products on the FMA units, whose operand layouts need far more registers: 32 x 32 tiles keep
    the spill at head dim 128 under 1 KB per thread on sm_90 (128 rows spill ~7 KB)."""
    if dtype == torch.float32:
        return PrefillConfig(block_m=32, block_n=32, num_warps=4)
    return PrefillConfig()
