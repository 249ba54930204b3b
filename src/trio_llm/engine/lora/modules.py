"""The transformers path's adapters: each Linear of the decoder layers wrapped in a module that
adds the step's low-rank updates to its output.

The engine's own forward calls `LoraBatch.add` after each projection itself; transformers'
modules do not, so their Linears are replaced, once at start, by `LoraLinear`s holding the
original (as `weight_sets.py` replaces Linears by their low-precision copies: the wrapper holds
the Linear as a child, so a weight set swapped in later lands inside it and keeps its adapters).
Every wrapper reads the step's batch from one shared `LoraHook`, which the model runner sets
before the forward and clears after it.
"""

from __future__ import annotations

import torch

from trio_llm.engine.lora.batch import LoraBatch
from trio_llm.engine.lora.targets import Target, decoder_layers, module_targets


class LoraHook:
    """The current step's adapter rows, shared by every wrapper (None: no row has one)."""

    __slots__ = ("batch",)

    def __init__(self) -> None:
        self.batch: LoraBatch | None = None


class LoraLinear(torch.nn.Module):
    """`base(x)`, plus the step's adapters' updates to target `target`'s rows."""

    def __init__(self, base: torch.nn.Linear, target: int, hook: LoraHook) -> None:
        super().__init__()
        self.base = base
        self.target = target
        self.hook = hook

    @property
    def weight(self) -> torch.Tensor:
        """The wrapped Linear's, for modules that read their projections' weights (a dtype, a
        device) rather than only call them."""
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.hook.batch
        if batch is not None:
            batch.add(self.target, x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1]))
        return out


def wrap_linears(model: torch.nn.Module, hook: LoraHook) -> list[Target]:
    """Replace every Linear of the decoder layers by a `LoraLinear` reading `hook`; the
    targets, in the wrappers' order."""
    found = module_targets(model)
    layers = decoder_layers(model)
    for index, (target, linear) in enumerate(found):
        parent_path, _, name = target.projection.rpartition(".")
        layer = layers[target.layer]
        parent = layer.get_submodule(parent_path) if parent_path else layer
        setattr(parent, name, LoraLinear(linear, index, hook))
    return [target for target, _ in found]
