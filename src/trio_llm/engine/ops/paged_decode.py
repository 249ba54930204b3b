"""Decode attention over the paged KV cache in place, on the CPU: a C++ kernel of our own
(csrc/paged_decode.cpp), built for this machine the first time it is needed.

Why C++ and why built here: the torch path gathers every context block of every decode into a
buffer per layer, then runs SDPA's flash kernel, made for many queries a head, on one query a
head. Reading the blocks where they lie, one task per sequence, halves the time of a step's
decode attention on one core (and does not fall apart when the two cores are shared, as
OpenMP's barriers in the gather and SDPA do). vLLM's CPU build ships the same idea. The kernel
is compiled with `-march=native`, so the build is keyed by this CPU's flags as well as the
source: a home directory shared by machines of different CPU classes gets one build per class.

`scripts/bootstrap.sh` builds it at set-up (`python -m trio_llm.engine.ops.paged_decode`); an
engine that finds no build compiles it at start-up (about 40 s, under a lock that other engines
wait on). Without a C++ compiler, or with `TRIO_LLM_PAGED_DECODE=0`, the torch path serves, and
the engine says so once.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

from trio_llm.engine.ops.native import Kernel

log = logging.getLogger(__name__)

KERNEL = Kernel("paged_decode.cpp")
LANES = 16
"""The kernel works in 16-float vectors: head sizes must be a multiple."""
MAX_HEAD_SIZE = 256
"""Its per-head loops are compiled for each multiple of LANES up to this."""
ENV = "TRIO_LLM_PAGED_DECODE"
build_directory = KERNEL.build_directory
extension = KERNEL.extension


def enabled() -> bool:
    """`TRIO_LLM_PAGED_DECODE=0` turns the kernel off (read per call: bench/engine_step/
    step_profile.py compares both in turns)."""
    return os.environ.get(ENV, "1") != "0"


def prepare() -> None:
    """Build or load the kernel now: at engine start, before the engine reports ready, so the
    first request's step does not wait on a compiler."""
    if enabled():
        extension()


def serves(dtype: torch.dtype, head_sizes: list[int]) -> bool:
    """Whether the kernel computes the queries of CPU layers with these head sizes and a cache
    of `dtype`: a float type it reads, head sizes it vectorizes, a built kernel, `enabled()`."""
    return (
        enabled()
        and dtype in (torch.float32, torch.bfloat16, torch.float16)
        and all(size % LANES == 0 and size <= MAX_HEAD_SIZE for size in head_sizes)
        and extension() is not None
    )


def supports(cache: Tensor) -> bool:
    """Whether the kernel computes the decodes of a layer with this cache (`serves`, on the
    CPU)."""
    return cache.device.type == "cpu" and serves(cache.dtype, [int(cache.shape[-1])])


def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> Tensor:
    """q [B, Hq, D] (one query per sequence) over each sequence's first `context_lens[b]`
    positions (the last `window` of them, for a sliding-window layer), read through
    `block_tables` [B, W] (int64) from caches [blocks, block_size, Hkv, D]; [B, Hq, D] back.
    A sequence of context 0 gets zeros."""
    ext = extension()
    assert ext is not None, "paged_decode called where supports() is false"
    return ext.paged_decode(
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        float(scale),
        float(softcap or 0.0),
        int(window or 0),
    )


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    built = extension()
    print(f"paged decode kernel: {'built in ' + str(build_directory()) if built else 'not built'}")
