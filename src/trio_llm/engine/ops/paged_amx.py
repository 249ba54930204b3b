"""Attention over the paged KV cache in place on AMX tiles (csrc/paged_amx.cpp), for bf16
caches on CPUs with AMX, or on AVX512-BF16's `vdpbf16ps` on CPUs with that and no AMX (AMD's
EPYC of the Zen 4 class): decodes and prefill queries alike, each query laid out as a decode
of its own position (`torch_plans.queries_as_decodes`).

Why beside ops/paged_decode.py: that kernel sums in float32 vector lanes, right for a decode's
one query a head; a prefill's many queries are a matrix product, which AMX tiles do 16 rows at a
time (and `vdpbf16ps` two products a lane, in registers reused over six rows). A row of
either product depends on that row alone, so this kernel keeps batch
invariance as the float kernel does: a query's result is the same bits in a decode, in a
prefill chunk of any size, and in any batch. The two kernels round differently, so an engine
keeps one of them for every query of a layer where invariance is on.

`TRIO_LLM_PAGED_AMX=0` turns it off (read per step plan, so a benchmark can compare both).
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType

import torch
from torch import Tensor

from trio_llm.engine.ops.machine_record import cpu_flags
from trio_llm.engine.ops.native import Kernel

log = logging.getLogger(__name__)

KERNEL = Kernel("paged_amx.cpp")
MAX_HEAD_SIZE = 256
ENV = "TRIO_LLM_PAGED_AMX"
build_directory = KERNEL.build_directory


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


@functools.cache
def extension() -> ModuleType | None:
    """The kernel, built where the CPU has AMX's bf16 tiles or AVX512-BF16 (elsewhere there is
    nothing to build: None)."""
    flags = cpu_flags().split()
    if "amx_bf16" not in flags and "avx512_bf16" not in flags:
        return None
    ext = KERNEL.extension()
    return ext if ext is not None and ext.available() else None


def prepare() -> None:
    """Build or load the kernel now, at engine start (where AMX or AVX512-BF16 runs and it is
    `enabled()`), and say which instructions do its products."""
    if enabled() and (ext := extension()) is not None:
        log.info("bf16 attention over the paged cache on %s (%s=0 turns it off)", ext.isa(), ENV)


def splits_for_invariance() -> bool:
    """Whether batch invariance asks this machine's kernel for two bf16 parts a probability.

    On AMX, yes: there invariance runs the quantized weights on the integer kernel, which rounds
    activations to int8, and one part on top of that cost the default file's perplexity +0.74%
    against llama.cpp where two parts cost +0.14% (an AMX Xeon, sixth sitting). On AVX512-BF16
    without AMX, no: the row-exact kernel there keeps bf16 activations, and one part measured
    16.7793 against two parts' 16.7800 (an AMD EPYC; the float kernel 16.7904, llama.cpp
    16.7273), while two parts cost a long prompt's attention 1.5x (docs/notes/
    2026-12-06-eighth.md)."""
    ext = extension()
    return ext is not None and ext.isa() == "amx"


def serves(cache: Tensor) -> bool:
    """Whether the kernel computes the queries of a layer with this cache: bf16 on the CPU, a
    head size of a multiple of 32, AMX or AVX512-BF16 here, `enabled()`."""
    size = int(cache.shape[-1])
    return (
        enabled()
        and cache.device.type == "cpu"
        and cache.dtype == torch.bfloat16
        and size % 32 == 0
        and size <= MAX_HEAD_SIZE
        and extension() is not None
    )


def paged_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    *,
    split: bool = False,
) -> Tensor:
    """q [B, Hq, D] (one query a row) over each row's first `context_lens[b]` positions, read
    through `block_tables` [B, W] (int64) from caches [blocks, block_size, Hkv, D]; [B, Hq, D]
    back. A row of context 0 gets zeros. `split`: the softmax's probabilities enter the values'
    product with 16 bits (two bf16 parts) instead of bf16's 8, a quarter slower."""
    ext = extension()
    assert ext is not None, "paged_attention called where serves() is false"
    return ext.paged_attention(
        q.contiguous(), k_cache, v_cache, block_tables, context_lens, float(scale), split
    )


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    built = extension()
    where = f"{built.isa()}, built in {build_directory()}" if built else "not built"
    print(f"bf16 attention kernel: {where}")
