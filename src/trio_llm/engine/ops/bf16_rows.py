"""Plain bf16 weights multiplied row-exactly by a kernel of our own (csrc/int4_rows.cpp's
`bf16_linear`), for CPUs with AVX512-BF16 (AMX or not), with batch invariance or without.

Why: oneDNN's inner product, the plan it replaces, computes a row alike from two rows up but
reads the weights poorly for a lone row: on an AMD EPYC, a decode step of the default model
unquantized (`--quantization none`) took 24-29 ms, its layers' weights read at about 9 GB/s.
The kernel is the quantized kernels' pass over a dequantized strip of 32 outputs, here on
weights stored in that layout once at start-up: one `vdpbf16ps` chain an output, the same at
any row count, so a lone row streams its weights once. Measured against oneDNN's plan (30
matrices of each of the default model's shapes in turn, 2 threads, an AMD EPYC): 0.16-0.7x the
time at one row, 0.7-0.9x at 32, 0.98-1.07x at 512 (bench/results/bf16_rows.md); a decode step
of the unquantized model 0.58x (one stream) and 0.73x (8), a 1,000-token prefill 0.97x
(bench/results/step_profile_bf16_rows.md).

With AMX the kernel takes every call on the tiles, straight from the same strips (`tiles`):
the `vdpbf16ps` chains lost to oneDNN there from 8 rows on. On the tiles, 30 matrices of each
of the default model's shapes in turn (2 threads, an AMX Xeon, bench/results/bf16_rows_amx.md):
0.21-0.55x the time of the class's former plan (oneDNN in calls of at most 32 rows) at every
row count from 1 to 512; against oneDNN's whole calls 0.37-0.86x from 1 to 32 rows, up to 1.6x
at 128-512. Every call of a weight takes the tiles, so a row's result still does not depend on
its call's rows.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from trio_llm.engine.ops import int4_rows
from trio_llm.engine.ops.int4_rows import STRIP
from trio_llm.engine.ops.strips import StripMatrix

ENV = "TRIO_LLM_BF16_ROWS"


def available() -> bool:
    """Whether the kernel is built here and not turned off (`TRIO_LLM_BF16_ROWS=0`)."""
    return os.environ.get(ENV, "1") != "0" and int4_rows.KERNEL.extension() is not None


@functools.cache
def tiles() -> bool:
    """Whether the kernel multiplies on AMX tiles here (an AMX CPU the process may use them
    on): every call of every weight whose inner dimension is a multiple of 32."""
    ext = int4_rows.KERNEL.extension()
    return ext is not None and ext.path(True) == "amx"


def takes(weight: Tensor) -> bool:
    """Whether the kernel multiplies `weight`: bf16, an even inner dimension (it sums pairs)."""
    return weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.shape[1] % 2 == 0


class StripWeight(StripMatrix):
    """A bf16 matrix as the kernel reads it: strips of 32 outputs, [strips, K / 2, 32, 2]
    (flattened to [strips, K * 32]), the outputs padded to whole strips with zeros."""

    __slots__ = ()

    @classmethod
    def pack(cls, weight: Tensor) -> StripWeight:
        rows = cls.by_strip(weight)
        count, _, k = rows.shape
        strips = rows.view(count, STRIP, k // 2, 2).transpose(1, 2).reshape(count, k * STRIP)
        return cls(strips.contiguous(), weight.shape)

    def linear(self, x: Tensor) -> Tensor:
        ext = int4_rows.KERNEL.extension()
        assert ext is not None, "StripWeight.matmul called where the kernel is not built"
        return ext.bf16_linear(x, self.strips, self.shape[0], tiles())
