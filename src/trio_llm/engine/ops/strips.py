"""A plain weight laid out for one of our strip kernels (ops/bf16_rows.py, ops/f32_rows.py):
what the matmul (ops/matmul.py) holds in place of the tensor, and multiplies through it.

Why a base: the engine handles both kernels' weights alike (the same call, the memory they
hold); only the layout and the kernel differ, which each subclass gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

STRIP = 32
"""Outputs a strip, in every strip kernel."""


@dataclass(slots=True, eq=False)
class StripMatrix:
    """A [N, K] matrix as strips of 32 outputs, flattened to [strips, K * 32] in the kernel's
    order, the outputs padded to whole strips with zeros; `shape` is the unpadded one."""

    strips: Tensor
    shape: torch.Size

    @staticmethod
    def by_strip(weight: Tensor) -> Tensor:
        """`weight` [N, K] as [strips, 32, K], its outputs padded with zero rows to whole
        strips: what each kernel's packing lays out its own way."""
        n, k = weight.shape
        padded = F.pad(weight.detach(), (0, 0, 0, -n % STRIP))
        return padded.view(-1, STRIP, k)

    @property
    def dtype(self) -> torch.dtype:
        return self.strips.dtype

    @property
    def nbytes(self) -> int:
        return self.strips.numel() * self.strips.element_size()

    def linear(self, x: Tensor) -> Tensor:
        """x [M, K] (contiguous) by the matrix: [M, N], in the subclass's kernel."""
        raise NotImplementedError

    def matmul(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        """x [M, K] by the matrix, plus `bias`: [M, N]."""
        out = self.linear(x.contiguous())
        return out if bias is None else out + bias
