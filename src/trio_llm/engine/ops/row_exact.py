"""Which row-exact kernel a quantized matrix takes on this machine: the integer one
(ops/int_rows.py) or the float one (ops/int4_rows.py), or neither (torch's kernels).

Why a choice: both compute a row the same way at every row count, but the integer one needs
VNNI. Where it has it, it was measured the faster at every row count on both classes of the
pool that do (an AMX Xeon, an AMD EPYC); the float kernel's grouped sums serve AVX512-BF16
without VNNI. The integer kernel also multiplies float32 activations; it rounds activations
to 8 bits per block of 32 (perplexity of the default file against llama.cpp's with every row
on it: +0.36% on an AMX Xeon, +0.30% on an AMD EPYC with the bf16 attention kernel; the float
kernel's +0.46%, an AMD EPYC).
"""

from __future__ import annotations

import torch

from trio_llm.engine.ops import int4_rows, int_rows
from trio_llm.engine.ops.int4_rows import RowsExact
from trio_llm.engine.ops.int_rows import IntRows

Packing = type[RowsExact] | type[IntRows]
"""A row-exact kernel, named by the packing its weights take."""


def kernel(invariant: bool, dtype: torch.dtype) -> Packing | None:
    """The row-exact kernel for quantized matrices with activations of `dtype` (the kernel
    dtype), `invariant` or not; None: torch's kernels. Without invariance a kernel is taken
    only where it is the default's (it beats torch's for few rows; dense copies serve many)."""
    if int_rows.available() and dtype in (torch.bfloat16, torch.float32):
        return IntRows
    if dtype != torch.bfloat16:
        return None
    wanted = int4_rows.available() if invariant else int4_rows.default()
    return RowsExact if wanted else None


def invariance_free(dtype: torch.dtype) -> bool:
    """Whether `auto` may keep batch invariance on for quantized weights here: where the
    row-exact kernel is the default's for every row anyway, because nothing beats it on a
    prompt's rows either, and a prompt's queries share the keys they read (ops/paged_amx.py in
    bf16, ops/paged_decode.py in float32).
    So on AVX512-BF16 without AMX (an AMD EPYC): the integer kernel takes 512 rows in 0.7-0.85x
    oneDNN's bf16 time (bench/results/int_rows_epyc.md), the float one in 1.0-1.1x; a prefill
    with invariance took 1.0x the time without it in bf16 (bench/results/
    step_profile_int_rows_epyc.md) and 0.97-1.02x in float32 (step_profile_fp32_epyc.md). On
    AVX2 alone (the integer kernel's AVX2 path, 0.55-0.75x torch's best at 512 rows,
    int_rows_avx2.md): a prefill 1.03x at 1,000 tokens and 1.07x at 2,000, decode steps
    0.95-0.99x (float32, every library held to AVX2 on an EPYC, step_profile_avx2.md). Not on
    AMX: there oneDNN's AMX matmuls on dense copies take a prompt's rows in a third of the
    integer kernel's time, and invariance, which keeps every row on that kernel, cost a
    1,000-2,000-token prefill 1.7-2.2x (an AMX Xeon, step_profile_amx_attention.md) and
    served tok/s 0.90-0.94x at 1 stream, 0.73-0.85x at 8 and 0.66-0.71x at 32 (the
    thirteenth sitting, bench/results/serving_vs_vllm_amx.md). An AMX path of the integer
    kernel does not change that: it took 1.1-1.7x VNNI's time (csrc/int_rows.cpp)."""
    if kernel(False, dtype) is None:
        return False
    return int4_rows.path() == "avx512_bf16" or int_rows.path() == "avx2"
