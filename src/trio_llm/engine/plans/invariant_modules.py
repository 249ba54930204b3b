"""Batch invariance on transformers' own modules: every nn.Linear computed by the engine's
`Matmul`, activations row by row, rotary embeddings on one thread (`replace_linears`), and the
modules it cannot make invariant (`unsupported_modules`).

Why separate from the decision (plans/invariance.py): this is how a model taken through the
generic path is rewritten once the decision is on; the decision only needs its verdicts.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trio_llm.engine.hf import text_config
from trio_llm.engine.ops.matmul import Matmul
from trio_llm.engine.ops.threads import rowwise


class InvariantLinear(torch.nn.Module):
    """An nn.Linear computed by a `Matmul`: how a model run on transformers' modules gets the
    engine's matmuls (`replace_linears`)."""

    def __init__(self, linear: torch.nn.Linear, matmul: Matmul) -> None:
        super().__init__()
        self.matmul = matmul
        self.weight = matmul.prepare(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return self.matmul(rows, self.weight, self.bias).view(*x.shape[:-1], self.out_features)


class RowwiseActivation(torch.nn.Module):
    """An activation module run through `rowwise`."""

    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return rowwise(self.act, x)


_ACTIVATIONS = (torch.nn.SiLU, torch.nn.GELU, torch.nn.Tanh, torch.nn.Sigmoid, torch.nn.Mish)


def _is_activation(module: torch.nn.Module) -> bool:
    return isinstance(module, _ACTIVATIONS) or type(module).__module__ == "transformers.activations"


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(out_features, in_features) of every nn.Linear in `model`."""
    return list(
        dict.fromkeys(
            (m.out_features, m.in_features)
            for m in model.modules()
            if isinstance(m, torch.nn.Linear)
        )
    )


def unsupported_modules(model: torch.nn.Module) -> str | None:
    """Why `replace_linears` cannot make `model` invariant, or None: matmuls outside nn.Linear
    (any weight of two or more dimensions in another module: GPT-2's Conv1D, the stacked
    expert weights a mixture of experts multiplies in grouped calls whose rows depend on the
    routing of the whole step), or a final logit soft-cap, whose tanh runs over the whole
    step's logits split between threads by their number of rows."""
    odd = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if not isinstance(m, torch.nn.Linear | torch.nn.Embedding)
            and any(p.dim() >= 2 for p in m.parameters(recurse=False))
        }
    )
    if odd:
        return (
            f"this model multiplies by weights in {', '.join(odd)} modules, outside the "
            "engine's row-exact matmuls"
        )
    text = text_config(getattr(model, "config", None))
    if getattr(text, "final_logit_softcapping", None) and torch.get_num_threads() > 1:
        return (
            "its final logit soft-cap (a tanh over the step's logits) is split between "
            "threads by the number of rows (run with --num-threads 1 to keep invariance)"
        )
    return None


def _one_thread(module: torch.nn.Module) -> None:
    """Run `module`'s forward on one thread (elementwise functions over many rows: the
    rotary embedding's cos and sin)."""
    saved: list[int] = []

    def before(*_: object) -> None:
        saved.append(torch.get_num_threads())
        torch.set_num_threads(1)

    def after(*_: object) -> None:
        torch.set_num_threads(saved.pop())

    module.register_forward_pre_hook(before)
    module.register_forward_hook(after)


def replace_linears(model: torch.nn.Module, matmul: Matmul) -> int:
    """Put an InvariantLinear in place of every nn.Linear of `model` and run its activation
    modules row by row, as engine/models/weight_sets.py swaps modules, and its rotary embeddings on
    one thread (their cos and sin over every row of the step); returns how many Linears."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                parent._modules[name] = InvariantLinear(child, matmul)
                count += 1
            elif _is_activation(child):
                parent._modules[name] = RowwiseActivation(child)
            elif type(child).__name__.endswith("RotaryEmbedding"):
                _one_thread(child)
    return count
