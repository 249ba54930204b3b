"""Which forward computes a model's steps, and why.

Two kinds: the engine's own forwards (a family's layers as a few large fused ops on plain
tensors, `engine/models/llama.py`), and transformers' modules with the paged attention plugged
in (`engine/models/generic.py`), which runs any causal LM transformers implements. An own
forward exists only where it measured faster than the generic path (bench/results/models.md).

`--model-impl`: `auto` takes an own forward wherever one computes exactly what the model's own
forward does, the generic path elsewhere; `own` insists on one (a model none covers is refused
with the reason); `transformers` always takes the generic path. The choice and its reason are
said at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trio_llm.engine.models import llama
from trio_llm.model_files import UnsupportedModelError

MODEL_IMPLS = ("auto", "own", "transformers")

OWN_FORWARDS: tuple[tuple[str, Callable[[torch.nn.Module], str | None]], ...] = (
    ("LlamaForward", llama.unsupported),
)
"""(name, why it does not cover a model or None) of every own forward, in the order tried."""


@dataclass(frozen=True, slots=True)
class ForwardChoice:
    own: str | None
    """The own forward's name, or None for transformers' modules."""
    reason: str

    def describe(self) -> str:
        path = f"own ({self.own})" if self.own else "transformers' modules, paged attention"
        return f"{path}: {self.reason}"


def choose(model: torch.nn.Module, requested: str, *, single_token_dtype: bool) -> ForwardChoice:
    """The forward for `model` under `--model-impl requested`; raises UnsupportedModelError
    when `own` is asked for and none covers the model."""
    if requested not in MODEL_IMPLS:
        raise ValueError(f"unknown model_impl {requested!r}; use {', '.join(MODEL_IMPLS)}")
    arch = type(model).__name__
    if requested == "transformers":
        return ForwardChoice(None, "asked for (--model-impl transformers)")
    if single_token_dtype:
        reason = (
            "--single-token-dtype swaps transformers' Linear modules, which the own forwards "
            "do not run"
        )
    else:
        refusals = []
        for name, unsupported in OWN_FORWARDS:
            why = unsupported(model)
            if why is None:
                return ForwardChoice(name, f"it computes {arch} as transformers does, faster")
            refusals.append(f"{name}: {why}")
        reason = f"no own forward covers {arch} ({'; '.join(refusals)})"
    if requested == "own":
        raise UnsupportedModelError(f"--model-impl own: no own forward for {arch} ({reason})")
    return ForwardChoice(None, reason)
