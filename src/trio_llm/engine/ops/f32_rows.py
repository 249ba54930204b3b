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
BLOCKS_ENV = "TRIO_LLM_F32_BLOCKS"
BLOCK = 32
"""Inputs a GGUF block's scale and offset cover."""
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


def keeps_blocks() -> bool:
    """Whether float32 weights from a GGUF's Q4_0, Q4_1 and Q8_0 blocks stay blocks here
    (`F32BlockWeight`) rather than dense copies; `TRIO_LLM_F32_BLOCKS=0` keeps dense ones."""
    return available() and os.environ.get(BLOCKS_ENV, "1") != "0"


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


class F32BlockWeight(StripMatrix):
    """A GGUF block weight (`w = d * q + m` per 32 inputs: Q4_0, Q4_1, Q8_0) that the kernel
    multiplies as the float32 values a dense copy of the file holds, bitwise: `strips` holds
    q as int8 in the strips' order, [strips, K * 32]; `scale` and `offset` each block's d and m
    for its 32 outputs, [strips, K / 32 * 32] (`offset` empty where the format has none).

    Why: `--dtype float32 --quantization none` asks for the file's values in float32 arithmetic,
    and a lone stream's step is the time its weights take to read (4 bytes a weight, 538 MB a
    token for the default model). Kept as blocks, they are 1.25 bytes a weight, dequantized in
    the registers of each pass for calls of few rows, into a thread's buffer once a block of
    rows for larger calls (csrc/f32_rows.cpp)."""

    __slots__ = ("offset", "scale")

    def __init__(self, strips: Tensor, shape: torch.Size, scale: Tensor, offset: Tensor) -> None:
        super().__init__(strips, shape)
        self.scale = scale
        self.offset = offset

    @classmethod
    def pack_blocks(cls, q: Tensor, d: Tensor, m: Tensor | None) -> F32BlockWeight:
        """q [N, K] int8 (the format's integer values), d and m [N, K / 32] float32."""
        n, k = q.shape
        if k % BLOCK or d.shape != (n, k // BLOCK) or (m is not None and m.shape != d.shape):
            raise ValueError(f"blocks of {BLOCK}: q {tuple(q.shape)}, d {tuple(d.shape)}")
        strips = cls.by_strip(q.to(torch.int8))
        count = strips.shape[0]
        q_strips = strips.transpose(1, 2).reshape(count, k * STRIP).contiguous()

        def per_block(values: Tensor) -> Tensor:
            return cls.by_strip(values.float()).transpose(1, 2).reshape(count, k).contiguous()

        offset = per_block(m) if m is not None else torch.empty(0)
        return cls(q_strips, torch.Size((n, k)), per_block(d), offset)

    @property
    def dtype(self) -> torch.dtype:
        """The values' dtype: what the kernel multiplies in."""
        return torch.float32

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.strips, self.scale, self.offset))

    def linear(self, x: Tensor) -> Tensor:
        ext = KERNEL.extension()
        assert ext is not None, "F32BlockWeight.matmul called where the kernel is not built"
        return ext.f32_blocks_linear(x, self.strips, self.scale, self.offset, self.shape[0])

    def dequantize(self) -> Tensor:
        """The dense [N, K] float32 values, as the `gguf` package computes them."""
        count, k = self.scale.shape

        def dense(t: Tensor, width: int) -> Tensor:
            return t.reshape(count, width, STRIP).transpose(1, 2).reshape(-1, width)

        offset = dense(self.offset, k // BLOCK) if self.offset.numel() else None
        q = dense(self.strips, self.strips.shape[1] // STRIP)
        return block_values(q, dense(self.scale, k // BLOCK), offset)[: self.shape[0]]


def block_values(q: Tensor, d: Tensor, m: Tensor | None) -> Tensor:
    """q [N, K] by blocks of 32 with scales d and offsets m [N, K / 32] as dense float32:
    `d * q`, then `+ m`, each rounded, as the `gguf` package and the kernel compute them."""
    w = d.repeat_interleave(BLOCK, 1) * q.float()
    return w if m is None else w + m.repeat_interleave(BLOCK, 1)


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    print(f"row-exact float32 kernel: {path() or 'not built'}")
