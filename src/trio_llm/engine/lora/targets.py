"""Where a LoRA adapter may apply: the model's projections, as the forward computes them.

A forward computes some projections fused (the engine's own Llama forward runs q, k and v as one
matmul, gate and up as another), so a *target* is one matmul the forward runs, made of *parts*:
the model's Linear modules whose outputs it concatenates, each with the name an adapter's
weights carry for it (PEFT names a LoRA pair by the module's path in the transformers model:
`model.layers.3.self_attn.q_proj`). An adapter's pair for a part adds its low-rank update to
that part's columns of the target's output.

Targets are read from the transformers model before the own forward fuses (and frees) its
layers, so the shapes an adapter is checked against are the checkpoint's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from trio_llm.engine.hf import decoder_of, text_config


@dataclass(frozen=True, slots=True)
class Part:
    module: str
    """The Linear's path in the transformers model (PEFT's name for it, less its prefix)."""
    out_features: int


@dataclass(frozen=True, slots=True)
class Target:
    """One matmul of the forward that adapters may add to."""

    layer: int
    projection: str
    """The forward's name for it (`qkv`, `o`, `gate_up`, `down`; a module path on the
    transformers path)."""
    in_features: int
    parts: tuple[Part, ...]

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's list of layers, whatever the family calls it (`model.layers` for the Llama
    family and most others, `transformer.h` for GPT-2's): its list of `num_hidden_layers`
    modules."""
    text = text_config(model.config)
    count = getattr(text, "num_hidden_layers", None)
    for module in decoder_of(model).children():
        if isinstance(module, torch.nn.ModuleList) and (count is None or len(module) == count):
            return module
    raise ValueError("the model's decoder has no list of its layers")


def layers_prefix(model: torch.nn.Module) -> str:
    """The path of the decoder's layer list in `model` (`model.layers` for the Llama family)."""
    layers = decoder_layers(model)
    for name, module in model.named_modules():
        if module is layers:
            return name
    raise ValueError("the model's decoder layers are not among its modules")


def fused_targets(model: torch.nn.Module, projections: Mapping[str, Sequence[str]]) -> list[Target]:
    """The targets of a forward that fuses each projection of `projections` (its name -> the
    Linear paths inside a decoder layer it concatenates, in order), layer by layer; the order
    is the forward's (layer-major, then `projections`' order)."""
    prefix = layers_prefix(model)
    targets = []
    for index, layer in enumerate(decoder_layers(model)):
        for projection, paths in projections.items():
            linears = [layer.get_submodule(path) for path in paths]
            targets.append(
                Target(
                    layer=index,
                    projection=projection,
                    in_features=int(linears[0].in_features),
                    parts=tuple(
                        Part(f"{prefix}.{index}.{path}", int(linear.out_features))
                        for path, linear in zip(paths, linears, strict=True)
                    ),
                )
            )
    return targets


def module_targets(model: torch.nn.Module) -> list[tuple[Target, torch.nn.Linear]]:
    """Every Linear inside the decoder layers as a target of its own, with the module: what
    the transformers path wraps."""
    prefix = layers_prefix(model)
    found = []
    for index, layer in enumerate(decoder_layers(model)):
        for path, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                target = Target(
                    layer=index,
                    projection=path,
                    in_features=int(module.in_features),
                    parts=(Part(f"{prefix}.{index}.{path}", int(module.out_features)),),
                )
                found.append((target, module))
    return found
