"""Quantized weights by activations quantized per block to int8, summed in integers: a C++
kernel of our own (csrc/int_rows.cpp) that is batch-invariant on every path it takes.

Why: a float kernel is row-exact only if every row count sums in one order, so it must pick
one order for a lone decode row and a prefill chunk alike and be slow for one of them
(ops/int4_rows.py; on an AMX machine its lone row cost 1.6-2x torch's int4 kernel). Integer
sums have no order. Each row's inputs are quantized per block of 32 to int8 by the block's own
scale, as llama.cpp quantizes activations for its quantized dot products, so a call may sum
with AMX tiles for a prefill chunk and with AVX512-VNNI for a decode row and give the same bits
either way (tests/engine/test_int_rows.py checks the paths against each other bitwise).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.ops.native import Kernel

KERNEL = Kernel("int_rows.cpp")
STRIP = 32
"""Outputs a strip: the packing pads the outputs to a multiple."""
ENV = "TRIO_LLM_INT_ROWS"
AMX_ROWS = 8
"""Calls of at least this many rows take AMX tiles where the CPU has them; fewer rows sum with
VNNI, which reads each weight byte once without a tile's set-up (the same bits either way)."""
FAST_PATHS = ("amx",)
"""Where the kernel is the quantized matmul of a batch-invariant engine by default: measured on
an AMX Xeon (bench/results/int_rows.md). Elsewhere its integer path may be as good; unmeasured,
so ops/int4_rows.py's float kernel keeps those classes."""


def path(allow_amx: bool = True, allow_vnni: bool = True) -> str | None:
    """The fastest path here ("amx", "vnni", "generic"), or None where the kernel is not built
    or `TRIO_LLM_INT_ROWS=0`."""
    if os.environ.get(ENV, "1") == "0":
        return None
    ext = KERNEL.extension()
    return None if ext is None else str(ext.path(allow_amx, allow_vnni))


def available() -> bool:
    """Whether quantized matrices should take this kernel here (`FAST_PATHS`)."""
    return path() in FAST_PATHS


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
            _per_strip(scale, pad),
            _per_strip(zero.float() - 8 * scale, pad),
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
            _per_strip(scale, pad),
            _per_strip(-128 * scale, pad),
            k // scale.shape[1],
            n,
            True,
        )

    def matmul(self, x: Tensor, amx_rows: int = AMX_ROWS, allow_vnni: bool = True) -> Tensor:
        """x [M, K] (bf16 or float32) by the matrix: [M, rows] in x's dtype. `amx_rows` and
        `allow_vnni` choose a path (the same bits on every one: tests compare them)."""
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
            amx_rows,
            allow_vnni,
        )


def _per_strip(values: Tensor, pad: int) -> Tensor:
    """[N, groups] -> [strips, groups, 32] float32, the outputs padded with zeros."""
    values = F.pad(values.float(), (0, 0, 0, pad))
    return values.view(-1, STRIP, values.shape[1]).transpose(1, 2).contiguous()


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    print(f"integer row-exact kernel: {path() or 'not built'}")
