"""Plain float32 weights multiplied row-exactly by a kernel of our own (csrc/f32_rows.cpp), with
batch invariance or without.

Why: a decode step of one stream multiplies one row by every weight, and the libraries' one-row
float32 products read the weights at a fraction of what the memory gives. On an AMD EPYC (2
threads): MKL's `F.linear` over the default model's 211 matrices 11.5 GB/s, the engine's step on
oneDNN's row-exact plan 18.9 GB/s, `torch.sum` over one block 56 GB/s (bench/results/
float32_gemv.md). So `--dtype float32 --quantization none` served a lone stream at a quarter of
the default's tok/s. The kernel keeps each weight in strips of 32 outputs laid out along the
inner dimension, so each thread streams its strips once, and sums every output as one chain of
fused multiply-adds over the inputs in order, the same at any row count and on any vector
width: a row's result does not depend on its call, which is what batch invariance asks of a
matmul, with no padding or splitting around it.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

from trio_llm.engine.ops.native import Kernel
from trio_llm.engine.ops.strips import STRIP, StripMatrix

KERNEL = Kernel("f32_rows.cpp")
ENV = "TRIO_LLM_F32_ROWS"
FAST_PATHS = ("avx512", "avx2")
"""Where the kernel sums with vector FMAs; its generic path is correct but slow, so there the
libraries stay."""


def path() -> str | None:
    """Which instructions the kernel sums with here ("avx512", "avx2", "generic"), or None where
    it is not built or `TRIO_LLM_F32_ROWS=0`."""
    if os.environ.get(ENV, "1") == "0":
        return None
    ext = KERNEL.extension()
    return None if ext is None else str(ext.path())


def available() -> bool:
    """Whether the engine should multiply float32 weights with this kernel here."""
    return path() in FAST_PATHS


def takes(weight: Tensor) -> bool:
    """Whether the kernel multiplies `weight`: a float32 matrix on the CPU."""
    return weight.dtype == torch.float32 and weight.dim() == 2 and weight.device.type == "cpu"


class F32StripWeight(StripMatrix):
    """A float32 matrix as the kernel reads it: strips of 32 outputs, [strips, K, 32]
    (flattened to [strips, K * 32]), the outputs padded to whole strips with zeros."""

    __slots__ = ()

    @classmethod
    def pack(cls, weight: Tensor) -> F32StripWeight:
        rows = cls.by_strip(weight)
        count, _, k = rows.shape
        return cls(rows.transpose(1, 2).reshape(count, k * STRIP).contiguous(), weight.shape)

    def linear(self, x: Tensor) -> Tensor:
        ext = KERNEL.extension()
        assert ext is not None, "F32StripWeight.matmul called where the kernel is not built"
        return ext.f32_linear(x, self.strips, self.shape[0])


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    print(f"row-exact float32 kernel: {path() or 'not built'}")
