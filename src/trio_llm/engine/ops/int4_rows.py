"""4-bit weights multiplied row-exactly at every row count, fast from one row to a prefill
chunk: a C++ kernel of our own (csrc/int4_rows.cpp).

Why: batch invariance needs one kernel for every call a weight takes part in, and neither of
torch's fits a whole step. Its int4 kernel is row-exact but dequantizes a weight tile for every
few rows (a decode batch of 32 costs 3-4x oneDNN's bf16 matmul); oneDNN is fast for a batch but
reads bf16 weights for a lone stream and sums in another order. This kernel dequantizes a strip
of 32 outputs once a call and multiplies every row by it, with AMX tiles where the CPU has them
(bench/results/int4_rows.md has the measured ratios per row count). Its weights are its own
packing, made once at load from the torch packing (`RowsExact.of`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.ops.native import Kernel

KERNEL = Kernel("int4_rows.cpp")
STRIP = 32
"""Outputs a strip: the kernel's packing pads the outputs to a multiple."""
ENV = "TRIO_LLM_INT4_ROWS"
FAST_PATHS = ("amx", "avx512_bf16")
"""Where the kernel outruns torch's int4 kernel from a few rows on; its generic path (no
AVX512-BF16) is correct but slow, so there torch's kernels stay."""
DEFAULT_PATHS = ("avx512_bf16",)
"""Where it is also the default's quantized kernel, batch invariance or not, unless the integer
kernel (ops/int_rows.py, VNNI) is there, which is faster still: its grouped sums (AVX512-BF16
without AMX) beat torch's int4 kernel from one row on, by 1.2-2x in a layer's matrices, and
oneDNN's bf16 matmul up to 128 rows (AMD EPYC, bench/results/int4_rows.md). Its AMX path
unpacks a lone row's strip more slowly than torch's kernel (1.6-2x, an AMX Xeon), so there the
default keeps torch's kernel for few rows."""


def path(allow_amx: bool = True) -> str | None:
    """Which instructions the kernel sums with here ("amx", "avx512_bf16", "generic"), or None
    where it is not built or `TRIO_LLM_INT4_ROWS=0`."""
    if os.environ.get(ENV, "1") == "0":
        return None
    ext = KERNEL.extension()
    return None if ext is None else str(ext.path(allow_amx))


def available() -> bool:
    """Whether a batch-invariant engine should multiply 4-bit weights with this kernel here."""
    return path() in FAST_PATHS


def default() -> bool:
    """Whether any engine should (`DEFAULT_PATHS`): the kernel for calls of few rows, dense
    copies for many where they are kept (models/dense_copies.py measures the crossover)."""
    return path() in DEFAULT_PATHS


@dataclass(slots=True, eq=False)
class RowsExact:
    """A 4-bit (or 8-bit) matrix in the kernel's packing: w = (q - 8) * scale + zero (4 bits)
    or q * scale (8 bits), per output and group of inputs."""

    packed: Tensor
    """4 bits: [strips, K / 2, 32] uint8, byte j of pair p holding output 32 s + j's inputs
    2 p (low nibble) and 2 p + 1 (high nibble); 8 bits (`pack8`): [strips, K / 2, 64]."""
    scales: Tensor
    """[strips, K / group, 32] bf16."""
    zeros: Tensor
    """[strips, K / group, 32] bf16."""
    group: int
    rows: int
    """Outputs computed (the packing's padded outputs are not)."""

    @classmethod
    def pack(cls, q: Tensor, scale: Tensor, zero: Tensor) -> RowsExact:
        """From values `q` [N, K] in 0..15 and `scale`, `zero` [N, K / group] (bf16 values:
        torch's int4 packing and GGUF's blocks have no others)."""
        n, k = q.shape
        group = k // scale.shape[1]
        pad = -n % STRIP
        q = F.pad(q, (0, 0, 0, pad)).to(torch.uint8)
        strips = q.shape[0] // STRIP
        pairs = q.view(strips, STRIP, k // 2, 2)
        packed = (pairs[..., 0] | (pairs[..., 1] << 4)).transpose(1, 2).contiguous()
        return cls(packed, per_strip(scale, pad), per_strip(zero, pad), group, n)

    @classmethod
    def pack8(cls, q: Tensor, scale: Tensor) -> RowsExact:
        """From signed 8-bit values `q` [N, K] and `scale` [N] (one an output) or [N, K /
        group] (w = q * scale, bf16 values): the kernel's 8-bit packing, [strips, K / 2, 64],
        output j's pair at bytes 2 j, 2 j + 1."""
        n, k = q.shape
        scale = scale.reshape(n, -1)
        group = k // scale.shape[1]
        pad = -n % STRIP
        q = F.pad(q, (0, 0, 0, pad))
        strips = q.shape[0] // STRIP
        packed = q.view(strips, STRIP, k // 2, 2).transpose(1, 2).reshape(strips, k // 2, -1)
        scales = per_strip(scale, pad)
        packed = packed.contiguous().view(torch.uint8)
        return cls(packed, scales, torch.zeros_like(scales), group, n)

    @staticmethod
    def describe() -> str:
        """The kernel and its path here, for the start-up log."""
        return f"the float row-exact kernel ({path()})"

    @staticmethod
    def build_key() -> str:
        """The kernel's build: what a measurement of it depends on."""
        return KERNEL.build_key()

    def matmul(self, x: Tensor) -> Tensor:
        """x [M, K] bf16 by the matrix: [M, rows] bf16."""
        ext = KERNEL.extension()
        assert ext is not None, "RowsExact.matmul called where available() is false"
        return ext.int4_linear(
            x.contiguous(), self.packed, self.scales, self.zeros, self.group, self.rows, True
        )


def per_strip(values: Tensor, pad: int, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """[N, groups] -> [strips, groups, 32] of `dtype`, the outputs padded with zeros: the
    layout of both row-exact kernels' scales."""
    values = F.pad(values.to(dtype), (0, 0, 0, pad))
    return values.view(-1, STRIP, values.shape[1]).transpose(1, 2).contiguous()


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    print(f"row-exact 4-bit kernel: {path() or 'not built'}")
