"""The model's Linear layers in a second, lower precision, for the steps that run one token.

One token's step on a CPU is bound by streaming the weights from memory, so half the bytes is
most of the win (bench/results/linear_kernels.md: fp16 0.41x the fp32 time at one row, but
1.5-4.4x slower from 8 rows up, hence only these steps). The model then holds two sets of its
Linear layers, the loaded ones and copies in the lower dtype, and the model runner selects one
set per step: selecting puts that set's modules in their parents' places, so a layer reads no
flag and a forward is whatever module is there (the LM head included).

Invariant: every set has the same Linear layers in the same places; only one is installed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_Submodules = dict[str, torch.nn.Module | None]


class LowPrecisionLinear(torch.nn.Module):
    """A copy of a Linear in `dtype`: inputs are cast to it, outputs back to theirs.

    The copies are plain tensor attributes, not Parameters: nothing trains them, and reading a
    plain attribute skips `Module.__getattr__`, three times per Linear per step."""

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = linear.weight.detach().to(dtype)
        self.bias = None if linear.bias is None else linear.bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)


class WeightSets:
    """The loaded Linear layers and their `dtype` copies; `select` installs one set."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self._places: list[tuple[_Submodules, str, torch.nn.Module, torch.nn.Module]]
        """(the parent's submodules, name, loaded Linear, its low-precision copy) per Linear."""
        self._places = [
            (parent._modules, name, child, LowPrecisionLinear(child, dtype))
            for parent in list(model.modules())
            for name, child in list(parent.named_children())
            if isinstance(child, torch.nn.Linear)
        ]
        self.low_precision = False
        """Whether the copies are installed."""

    def select(self, low_precision: bool) -> None:
        if low_precision == self.low_precision:
            return
        # Into the submodule dicts directly: setattr's checks took 0.4 ms a switch (211 Linears
        # of SmolLM2-135M), this 0.04 ms; each name is already a submodule.
        for modules, name, loaded, copy in self._places:
            modules[name] = copy if low_precision else loaded
        self.low_precision = low_precision
