"""Quantized weights by activations quantized per block to int8, summed in integers: a C++
kernel of our own (csrc/int_rows.cpp) whose every row is the same bits at any row count.

Why: a float kernel is row-exact only if every row count sums in one order, so it must pick
one order for a lone decode row and a prefill chunk alike and be slow for one of them
(ops/int4_rows.py: on an AMX machine its lone row cost 1.6-2x torch's int4 kernel). Integer
sums have no order. Each row's inputs are quantized per block of 32 to int8 by the block's own
scale, as llama.cpp quantizes activations for its quantized dot products, and AVX512-VNNI (or
AVX2's byte products, on the pool's CPUs without AVX-512) sums a block's products exactly; the
scalar path gives the same bits (tests/engine/test_int_rows.py compares them). A lone row reads
each weight byte once and unpacks it with an `and`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.ops.int4_rows import STRIP, per_strip
from trio_llm.engine.ops.native import Kernel

KERNEL = Kernel("int_rows.cpp")
ENV = "TRIO_LLM_INT_ROWS"


PATHS = ("generic", "avx2", "vnni")
"""How the kernel can sum, slowest first: scalar code, AVX2's byte products, AVX512-VNNI's. Every
path gives the same bits; a build has those its CPU's flags compile."""


def path(best: str = "vnni") -> str | None:
    """How the kernel sums here, at most `best` (one of `PATHS`), or None where it is not built
    or `TRIO_LLM_INT_ROWS=0`."""
    if os.environ.get(ENV, "1") == "0":
        return None
    ext = KERNEL.extension()
    return None if ext is None else str(ext.path(PATHS.index(best)))


def available() -> bool:
    """Whether quantized matrices should take this kernel here: where it sums with VNNI or
    AVX2's byte products. Every class of the pool measured it the fastest kernel for them at
    every row count: on an AMX Xeon a lone row takes 0.2-0.35x the float row-exact kernel's
    time and 0.4-0.5x torch's int4 kernel's (bench/results/int_rows.md); on an AMD EPYC
    (AVX512-BF16, no AMX) 0.6-0.9x the float kernel's from 4 to 512 rows, and 0.7-0.85x oneDNN's
    bf16 matmul at 512 (bench/results/int_rows_epyc.md); on the AVX2-only class (emulated on the
    EPYC: every library held to AVX2) 0.3-0.6x the best of torch's int4 kernel and dense
    float32 or bf16 copies up to 32 rows, 0.55-0.75x at 512 (bench/results/int_rows_avx2.md).
    Its scalar path is correct but slow."""
    return path() in ("vnni", "avx2")


@dataclass(slots=True, eq=False)
class IntRows:
    """A 4-bit (w = (q - 8) * scale + zero) or 8-bit (w = q * scale) matrix in the kernel's
    packing, multiplied by int8-quantized rows."""

    packed: Tensor
    """[strips, K * 16] uint8 (4 bits) or [strips, K * 32] (8 bits): csrc/int_rows.cpp's layout."""
    scales: Tensor
    """[strips, K / group, 32] float32."""
    zeros: Tensor
    """[strips, K / group, 32] float32: the zero of bytes u (w = u * scale + zero), that is
    zero - 8 * scale for 4 bits (u = q) and -128 * scale for 8 (u = q + 128)."""
    group: int
    rows: int
    """Outputs computed (the packing's padded outputs are not)."""
    eight: bool

    @classmethod
    def pack(cls, q: Tensor, scale: Tensor, zero: Tensor) -> IntRows:
        """From values `q` [N, K] in 0..15 and `scale`, `zero` [N, K / group]."""
        n, k = q.shape
        pad = -n % STRIP
        q = F.pad(q, (0, 0, 0, pad)).to(torch.uint8)
        strips = q.shape[0] // STRIP
        # [strips, 32 outputs, K / 8 octets, 2 halves, 4] -> [strips, octets, 32, 4]
        octets = q.view(strips, STRIP, k // 8, 2, 4)
        packed = (octets[..., 0, :] | (octets[..., 1, :] << 4)).transpose(1, 2)
        scale = scale.float()
        return cls(
            packed.reshape(strips, -1).contiguous(),
            per_strip(scale, pad, torch.float32),
            per_strip(zero.float() - 8 * scale, pad, torch.float32),
            k // scale.shape[1],
            n,
            False,
        )

    @classmethod
    def pack8(cls, q: Tensor, scale: Tensor) -> IntRows:
        """From signed 8-bit values `q` [N, K] and `scale` [N] or [N, K / group]."""
        n, k = q.shape
        scale = scale.reshape(n, -1).float()
        pad = -n % STRIP
        u = (F.pad(q, (0, 0, 0, pad)).to(torch.int16) + 128).to(torch.uint8)
        strips = u.shape[0] // STRIP
        packed = u.view(strips, STRIP, k // 4, 4).transpose(1, 2).reshape(strips, -1)
        return cls(
            packed.contiguous(),
            per_strip(scale, pad, torch.float32),
            per_strip(-128 * scale, pad, torch.float32),
            k // scale.shape[1],
            n,
            True,
        )

    @staticmethod
    def describe() -> str:
        """The kernel and its path here, for the start-up log."""
        return f"the integer row-exact kernel ({path()})"

    @staticmethod
    def build_key() -> str:
        """The kernel's build: what a measurement of it depends on."""
        return KERNEL.build_key()

    def matmul(self, x: Tensor, best: str = "vnni") -> Tensor:
        """x [M, K] (bf16 or float32) by the matrix: [M, rows] in x's dtype, on the fastest
        path built here up to `best` (`PATHS`; the same bits on each: tests compare them)."""
        ext = KERNEL.extension()
        assert ext is not None, "IntRows.matmul called where the kernel is not built"
        return ext.int_linear(
            x.contiguous(),
            self.packed,
            self.scales,
            self.zeros,
            self.group,
            self.rows,
            self.eight,
            PATHS.index(best),
        )


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    print(f"integer row-exact kernel: {path() or 'not built'}")
