"""Which row-exact kernel a quantized matrix takes on this machine: the integer one
(ops/int_rows.py) or the float one (ops/int4_rows.py), or neither (torch's kernels).

Why a choice: both compute a row the same way at every row count, but each was measured fast
on its own CPU class. The integer kernel's lone row takes 0.2-0.3x the float kernel's time on
an AMX Xeon, where the float kernel's lone row loses to torch's int4 kernel; the float kernel's
grouped sums are the measured default on AVX512-BF16 without AMX (an AMD EPYC), where the
integer kernel is unmeasured. The integer kernel also multiplies float32 activations; it
rounds activations to 8 bits per block of 32 (perplexity of the default file +0.36% against
llama.cpp's with every row on it, an AMX Xeon; the float kernel's +0.46%, an AMD EPYC).
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
    default's kernel makes it cost little, measured. The float kernel on AVX512-BF16 without
    AMX: decode steps 0.94-1.08x, a prefill 1.08-1.23x (an AMD EPYC,
    bench/results/step_profile_invariant.md). Not the integer kernel on AMX: decode steps
    0.95-1.03x, but a 1,000-2,000-token prefill 1.7-2.2x (an AMX Xeon, bench/results/
    step_profile_amx_attention.md; 3-3.7x before the attention ran on AMX tiles), and served
    under load 0.86-0.93x the tok/s: without invariance oneDNN's AMX matmuls on dense copies take
    a prompt's rows, with it this kernel on VNNI (half a prefill's time)."""
    return kernel(False, dtype) is RowsExact
