"""A quantized GGUF file's matrices inside transformers' own modules: the generic path's
quantized weights, for the families the own forward does not compute (Gemma, Phi-3, Qwen3,
Granite, OLMo, ...).

Why: transformers reads a GGUF by dequantizing every tensor, so a Q4 file of such a family took
four times its memory and ran at float speed, silently. Here the model is first loaded as
transformers reads it (its norms, embeddings and every tensor it reorders come out right), then
each `nn.Linear` of its decoder layers whose tensor the file holds in a quantized format is
replaced by a `QuantizedLinear` over that tensor in the form the own forward runs it in
(models/gguf_weights.py: Q4_0 / Q4_1 / Q4_K as int4 groups, Q8_0 as two exact int4 planes,
the other formats as int8 rows), multiplied by the same kernels and the same choice of kernel
per call (`quant.dispatching`: the quantized kernel for few rows, a dense copy for many).

Which file tensor feeds which module follows llama.cpp's names (gguf's tensor name map), and
the rows llama.cpp reorders (Llama-style rotary interleaving of Q and K, GPT-NeoX's fused QKV
grouping) are found by comparing with the values transformers read: a module is replaced only
where the quantized weight dequantizes to what transformers holds, so a layout this module does
not know keeps its float weight and is named in the log, never computed wrong.

A mixture of experts' stacked parameters (transformers' `...Experts` modules: `gate_up_proj`
[E, 2I, H] and `down_proj` [E, H, I]) become a `QuantizedExperts`, each expert's two matrices
read from llama.cpp's `ffn_{gate,up,down}_exps` stacks, running the same expert loop.

The token embedding becomes a `QuantizedEmbedding` over the file's table, in the form the own
forward keeps its vocabulary (`GGUFWeights.vocabulary`), and a tied LM head a `QuantizedLinear`
over the same weight: in bf16 the table was most of what a small model's memory held over its
file (1.31-1.60x the file, bench/results/quant_survey.md). What stays float, and is said at
start-up: a table the file stores float or in a layout not matched, and modules that are
neither Linear nor Embedding (GPT-2's Conv1D).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from trio_llm.engine.models.gguf_weights import GGUFWeights, _Int4Values, _Int8Blocks
from trio_llm.engine.quant import Int4Weight, Int8Weight, QuantizedWeight, dispatching
from trio_llm.engine.quant.weights import split_int8

log = logging.getLogger(__name__)

Linear = Callable[[Tensor, Tensor, Tensor | None], Tensor]

MATCH_TOLERANCE = 0.02
"""Largest difference, relative to the matrix's largest magnitude, between a quantized weight
dequantized and what transformers read for the same module: rounding to the activations' dtype
differs by far less; a wrong row order by about the weights' whole range."""


class QuantizedLinear(nn.Module):
    """An `nn.Linear` whose weight is a quantized one: `linear` (`quant.dispatching`) picks the
    kernel for each call."""

    def __init__(self, weight: QuantizedWeight, bias: Tensor | None, linear: Linear) -> None:
        super().__init__()
        self.qweight = weight
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features, self.in_features = weight.shape
        self.linear = linear

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return self.linear(rows, self.qweight, self.bias).reshape(*x.shape[:-1], -1)  # type: ignore[arg-type]

    def extra_repr(self) -> str:
        kind = type(self.qweight).__name__
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


class QuantizedEmbedding(nn.Module):
    """An `nn.Embedding` over a quantized table: a lookup dequantizes the rows it reads. A
    family's scaled embedding (Gemma's `embed_scale`) keeps its factor, applied as its own
    module applies it."""

    def __init__(self, weight: QuantizedWeight, original: nn.Module) -> None:
        super().__init__()
        self.qweight = weight
        self.dtype = original.weight.dtype
        self.num_embeddings, self.embedding_dim = weight.shape
        scale = getattr(original, "embed_scale", None)
        self.embed_scale = scale if isinstance(scale, Tensor | float | int) else None

    def forward(self, ids: Tensor) -> Tensor:
        rows = self.qweight.rows(ids.reshape(-1)).to(self.dtype)  # type: ignore[union-attr]
        out = rows.view(*ids.shape, self.embedding_dim)
        if self.embed_scale is None:
            return out
        scale = self.embed_scale
        return out * (scale.to(out.dtype) if isinstance(scale, Tensor) else scale)

    def extra_repr(self) -> str:
        kind = type(self.qweight).__name__
        return f"{self.num_embeddings}, {self.embedding_dim}, {kind}"


class QuantizedExperts(nn.Module):
    """A mixture of experts' expert loop (transformers' own: each expert hit computes its
    tokens' gated MLP, weighted, summed into their rows) on each expert's quantized matrices."""

    def __init__(
        self,
        gate_up: list[QuantizedWeight],
        down: list[QuantizedWeight],
        act_fn: Callable[[Tensor], Tensor],
        linear: Linear,
    ) -> None:
        super().__init__()
        self.gate_up, self.down = gate_up, down
        self.num_experts = len(gate_up)
        self.act_fn = act_fn
        self.linear = linear

    def forward(self, hidden: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        out = torch.zeros_like(hidden)
        hit = top_k_index.flatten().unique().tolist()
        for expert in hit:
            if expert >= self.num_experts:  # transformers' padding slot
                continue
            token, slot = torch.where(top_k_index == expert)
            x = hidden[token]
            gate, up = self.linear(x, self.gate_up[expert], None).chunk(2, dim=-1)  # type: ignore[arg-type]
            y = self.linear(self.act_fn(gate) * up, self.down[expert], None)  # type: ignore[arg-type]
            out.index_add_(0, token, (y * top_k_weights[token, slot, None]).to(out.dtype))
        return out

    def weights(self) -> list[QuantizedWeight]:
        return [*self.gate_up, *self.down]


def quantize_modules(model: nn.Module, path: Path, dtype: torch.dtype) -> Counter[str]:
    """Replace `model`'s decoder Linears by the GGUF file's quantized tensors; returns how many
    modules took which form, plus what stayed float and why (for the log and the tests)."""
    import gguf

    g = GGUFWeights(path, dtype)
    arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == g.architecture), None)
    if arch is None:
        raise ValueError(f"{path.name}: gguf knows no architecture {g.architecture!r}")
    config = model.config
    text = getattr(config, "text_config", config)
    names = gguf.get_tensor_name_map(arch, int(text.num_hidden_layers))
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    linear = dispatching(torch.nn.functional.linear)
    kept: Counter[str] = Counter()
    for parent, child, module, name in _linears(model):
        mapped = names.get_name(name)
        tensor = None if mapped is None else f"{mapped}.weight"
        if tensor is None or not g.has(tensor):
            kept[f"{_short(name)} float (no tensor in the file)"] += 1
            continue
        if g.tensors[tensor].tensor_type.name in ("F32", "F16", "BF16"):
            kept[f"{_short(name)} float (stored float)"] += 1
            continue
        weight = _matching(g, tensor, module.weight, _row_orders(name, heads, kv_heads))
        if weight is None:
            kept[f"{_short(name)} float (its file layout is not one this engine knows)"] += 1
            continue
        bias = None if module.bias is None else module.bias.detach()
        setattr(parent, child, QuantizedLinear(weight, bias, linear))
        kept[f"{g.tensors[tensor].tensor_type.name} as {_form(weight)}"] += 1
    for name, module in list(model.named_modules()):
        if _is_experts(module):
            _quantize_experts(model, name, module, g, linear, kept)
    _quantize_vocabulary(model, g, names, linear, kept)
    stayed = [n for n, m in model.named_modules() if _is_float_matrix(m)]
    for name in stayed:
        kept[f"{_short(name)} float ({type(model.get_submodule(name)).__name__})"] += 1
    log.info(
        "%s: transformers' modules on its quantized tensors: %s",
        path.name,
        ", ".join(f"{n} {k}" for k, n in sorted(kept.items())),
    )
    return kept


def quantized_linears(model: nn.Module) -> list[QuantizedLinear | QuantizedExperts]:
    return [m for m in model.modules() if isinstance(m, QuantizedLinear | QuantizedExperts)]


def quantized_weights(model: nn.Module) -> list[QuantizedWeight]:
    out: list[QuantizedWeight] = []
    for module in quantized_linears(model):
        out += module.weights() if isinstance(module, QuantizedExperts) else [module.qweight]
    return out


def use_dense(model: nn.Module, dense: bool) -> None:
    """Whether calls of many rows may leave the quantized kernels (off: batch invariance)."""
    linear = dispatching(torch.nn.functional.linear, dense=dense)
    for module in quantized_linears(model):
        module.linear = linear


def _is_experts(module: nn.Module) -> bool:
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, nn.Parameter)
        and isinstance(down, nn.Parameter)
        and gate_up.dim() == 3
        and down.dim() == 3
        and hasattr(module, "act_fn")
        and not any("bias" in n for n, _ in module.named_parameters(recurse=False))
    )


def _quantize_experts(
    model: nn.Module, name: str, module: nn.Module, g: GGUFWeights, linear: Linear,
    kept: Counter[str],
) -> None:  # fmt: skip
    """Replace an experts module by the file's expert stacks, each expert's gate and up fused
    as transformers fuses them; kept float (and counted so) where the file has no stacks or
    they do not match what transformers read."""
    block = next((p for p in name.split(".") if p.isdigit()), None)
    names = [f"blk.{block}.ffn_{part}_exps.weight" for part in ("gate", "up", "down")]
    if block is None or not all(g.has(n) for n in names):
        kept[f"{_short(name)} float (no expert stacks in the file)"] += 1
        return
    gate_up_ref, down_ref = module.gate_up_proj, module.down_proj  # type: ignore[union-attr]
    experts, inter, hidden = (int(d) for d in gate_up_ref.shape)
    inter //= 2
    gate_up, down = [], []
    for e in range(experts):
        rows = np.arange(e * inter, (e + 1) * inter)
        fused = g.matrix(names[0], names[1], rows=(rows, rows))
        own = g.read(names[2], rows=np.arange(e * hidden, (e + 1) * hidden))
        pair = (fused if not isinstance(fused, Tensor) else None, _runnable(own, g.kernel_dtype))
        if pair[0] is None or pair[1] is None:
            kept[f"{_short(name)} float (stored float)"] += 1
            return
        for weight, reference in ((pair[0], gate_up_ref[e]), (pair[1], down_ref[e])):
            expected = reference.detach().float()
            bound = MATCH_TOLERANCE * float(expected.abs().max().clamp(min=1e-12))
            if float((weight.dequantize().float() - expected).abs().max()) > bound:
                kept[f"{_short(name)} float (its file layout is not one this engine knows)"] += 1
                return
        gate_up.append(pair[0])
        down.append(pair[1])
    parent_name, _, child = name.rpartition(".")
    quantized = QuantizedExperts(gate_up, down, module.act_fn, linear)  # type: ignore[arg-type]
    setattr(model.get_submodule(parent_name), child, quantized)
    kept[f"{_short(name)} ({g.tensors[names[0]].tensor_type.name}) as {_form(gate_up[0])}"] += 1


def _linears(model: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Linear, str]]:
    """The decoder layers' Linears as (parent, attribute, module, qualified name); the LM
    head too where it is its own matrix (not tied to the embedding)."""
    tied = _lm_head_tied(model)
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        if name.endswith("lm_head") and tied:
            continue
        parent_name, _, child = name.rpartition(".")
        yield model.get_submodule(parent_name), child, module, name


def _quantize_vocabulary(
    model: nn.Module, g: GGUFWeights, names: object, linear: Linear, kept: Counter[str]
) -> None:
    """The token embedding on the file's table, and a tied LM head on the same weight."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if not isinstance(embed, nn.Embedding) or not _plain_lookup(embed):
        return  # a module of its own kind (a forward this class does not repeat): left float
    name = next(n for n, m in model.named_modules() if m is embed)
    mapped = names.get_name(name)  # type: ignore[attr-defined]
    tensor = None if mapped is None else f"{mapped}.weight"
    if tensor is None or not g.has(tensor):
        return
    if g.tensors[tensor].tensor_type.name in ("F32", "F16", "BF16"):
        kept[f"{_short(name)} float (stored float)"] += 1
        return
    tied = _lm_head_tied(model)
    weight = g.vocabulary(tensor)
    expected = embed.weight.detach().float()
    bound = MATCH_TOLERANCE * float(expected.abs().max().clamp(min=1e-12))
    if (
        not isinstance(weight, Int4Weight | Int8Weight)
        or weight.shape != tuple(expected.shape)
        or float((weight.dequantize().float() - expected).abs().max()) > bound
    ):
        kept[f"{_short(name)} float (its file layout is not one this engine knows)"] += 1
        return
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, QuantizedEmbedding(weight, embed))
    kept[f"{g.tensors[tensor].tensor_type.name} as {_form(weight)} (embedding)"] += 1
    if tied:
        model.lm_head = QuantizedLinear(weight, None, linear)  # type: ignore[assignment]
        kept[f"{g.tensors[tensor].tensor_type.name} as {_form(weight)} (tied LM head)"] += 1


SCALED_EMBEDDINGS = frozenset({"Gemma3TextScaledWordEmbedding", "Gemma3nTextScaledWordEmbedding"})
"""transformers' embeddings whose forward is the lookup times `embed_scale` (Gemma's family),
named rather than imported: importing a model's module pulls in torch._dynamo and Triton."""


def _plain_lookup(embed: nn.Embedding) -> bool:
    """Whether the module's forward is a lookup (times `embed_scale`) that `QuantizedEmbedding`
    repeats; another forward of its own leaves the table float."""
    return type(embed).forward is nn.Embedding.forward or type(embed).__name__ in SCALED_EMBEDDINGS


def _lm_head_tied(model: nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    return (
        isinstance(head, nn.Linear)
        and embed is not None
        and head.weight.data_ptr() == embed.weight.data_ptr()
    )


def _row_orders(name: str, heads: int, kv_heads: int) -> list[Callable[[int], np.ndarray | None]]:
    """The row orders llama.cpp may have stored this module's weight in: as is, and for Q and
    K Llama's rotary interleaving; for a fused QKV GPT-NeoX's per-head grouping."""
    orders: list[Callable[[int], np.ndarray | None]] = [lambda _n: None]
    if name.endswith(("q_proj", "k_proj")):
        h = heads if name.endswith("q_proj") else kv_heads
        orders.append(lambda n: _interleaved(n, h))
    if name.endswith("query_key_value"):
        orders.append(lambda n: _grouped(n, heads))
    return orders


def _interleaved(out_features: int, heads: int) -> np.ndarray:
    half = out_features // heads // 2
    return np.arange(out_features).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)


def _grouped(out_features: int, heads: int) -> np.ndarray:
    """GPT-NeoX: transformers holds [head][q, k, v] rows, llama.cpp [q, k, v][head]."""
    order = np.arange(out_features).reshape(heads, 3, -1).swapaxes(0, 1).reshape(-1)
    return np.argsort(order)


def _matching(
    g: GGUFWeights,
    tensor: str,
    reference: Tensor,
    orders: list[Callable[[int], np.ndarray | None]],
) -> QuantizedWeight | None:
    """The file's tensor in its running form, in the first row order whose values match what
    transformers read; None where none does."""
    expected = reference.detach().float()
    bound = MATCH_TOLERANCE * float(expected.abs().max().clamp(min=1e-12))
    for order in orders:
        rows = order(int(g.tensors[tensor].shape[1]))
        weight = _runnable(g.read(tensor, rows=rows), g.kernel_dtype)
        if weight is None:
            return None
        got = weight.dequantize().float()
        if got.shape == expected.shape and float((got - expected).abs().max()) <= bound:
            return weight
    return None


def _runnable(read: object, dtype: torch.dtype) -> QuantizedWeight | None:
    if isinstance(read, _Int4Values):
        return Int4Weight.pack(read.q, read.scale, read.zero, dtype)
    if isinstance(read, _Int8Blocks):
        return split_int8(read.q, read.d, dtype)
    if isinstance(read, Int8Weight):
        return read
    return None


def _form(weight: QuantizedWeight) -> str:
    if isinstance(weight, Int4Weight):
        return "two int4 planes" if weight.split else "int4"
    return "int8 rows"


def _is_float_matrix(module: nn.Module) -> bool:
    """A module multiplying float weights that stays so: the embedding, GPT-2's Conv1D."""
    return isinstance(module, nn.Embedding) or type(module).__name__ == "Conv1D"


def _short(name: str) -> str:
    """A module's name without its layer number, so the log counts kinds, not layers."""
    return ".".join(part for part in name.split(".") if not part.isdigit())


def describe(formats: Counter[str]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(formats.items()))
