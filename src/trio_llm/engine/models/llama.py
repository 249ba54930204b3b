"""The engine's own forward for the Llama family (Llama, Qwen2, Mistral), on the packed row.

Why not transformers' modules: on a CPU a decode step of a small model is short, and a third of it
went to the modules' small ops (views, transposes, separate q/k/v and gate/up projections,
per-layer rotary embeddings, keyword plumbing), not to the matmuls. Here each layer is one fused
QKV projection, rotary embeddings read from a table built once, the paged attention call, the
output projection, and one fused gate-up projection: a handful of large ops per layer, on the
`[T, hidden]` packed row directly (no batch dimension, no transposes).

The weights are the loaded transformers model's, fused once at start-up (the separate tensors are
then dropped); the numbers follow transformers' Llama exactly (RMSNorm in float32, rotary
embeddings in float32 cast to the model's dtype, the same order of operations), so in float32 the
greedy output equals Hugging Face's. Architectures it does not cover (another attention layout, a
rotary embedding that changes with the sequence length) keep the transformers path.

Every matmul goes through `linear`, a `Matmul` the runner chooses, on weights it prepared
(engine/plans/invariance.py): that is where batch invariance is kept, with the activation computed
row by row when it is on. A step with LoRA adapters brings a `LoraBatch` (engine/lora/), which
adds each adapter's update to its rows after the projections of `LORA_PROJECTIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.attention import AttentionMetadata
from trio_llm.engine.ops import fused
from trio_llm.engine.ops.matmul import Matmul, Weight
from trio_llm.engine.ops.threads import rowwise
from trio_llm.engine.quant.weights import embedding, is_quantized

if TYPE_CHECKING:
    from trio_llm.engine.lora import LoraBatch

ARCHITECTURES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"})
Linear = Callable[[Tensor, Weight, Tensor | None], Tensor]
"""How the forward multiplies: a `Matmul`, or quantized weights' dispatch around one."""
_STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})
"""Rotary embeddings whose frequencies do not depend on the sequence length, so a table built
once holds them for every position."""


LORA_PROJECTIONS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
"""The fused projections adapters may add to, in the order of `LoraBatch.add`'s targets
within a layer: each one's Linears of a transformers decoder layer, in its output's order."""
_QKV, _O, _GATE_UP, _DOWN = range(len(LORA_PROJECTIONS))


def unsupported(model: torch.nn.Module) -> str | None:
    """Why this forward would not compute what `model`'s own forward does; None if it would."""
    config = model.config
    arch = type(model).__name__
    if arch not in ARCHITECTURES:
        return f"{arch} is not of the Llama family ({', '.join(sorted(ARCHITECTURES))})"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in _STATIC_ROPE:
        return f"its rotary embedding ({rope_type}) changes with the sequence length"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its activation is {config.hidden_act}, not silu"
    if getattr(config, "mlp_bias", False):
        return "its MLP has biases"
    return None


@dataclass(slots=True)
class _Layer:
    """A layer's weights; the matrices may be quantized (`engine.quant`), which only `linear`
    looks into."""

    input_norm: Tensor
    qkv: Weight
    """[(Hq + 2 Hkv) * D, hidden]: q, k and v projections in one."""
    qkv_bias: Tensor | None
    o: Weight
    post_norm: Tensor
    gate_up: Weight
    """[2 * intermediate, hidden]: the gate projection, then the up projection."""
    down: Weight


@dataclass(slots=True)
class Weights:
    """Everything the forward multiplies by, fused: from a loaded model (`of`) or built
    elsewhere (a GGUF file's quantized tensors, `engine.quant`)."""

    embed: Tensor
    norm: Tensor
    lm_head: Tensor
    layers: list[_Layer]
    dtype: torch.dtype
    """The activations' dtype."""

    @classmethod
    def of(cls, model: torch.nn.Module) -> Weights:
        decoder = model.model
        return cls(
            embed=decoder.embed_tokens.weight.detach(),
            norm=decoder.norm.weight.detach(),
            lm_head=model.lm_head.weight.detach(),
            layers=[LlamaForward._fuse(layer) for layer in decoder.layers],
            dtype=decoder.embed_tokens.weight.dtype,
        )


class LlamaForward:
    """A Llama-family model as plain tensors, computing hidden states for the packed row."""

    lora_projections = LORA_PROJECTIONS
    """What the runner builds the LoRA targets from (an own forward without it has none)."""

    def __init__(
        self,
        model: torch.nn.Module,
        max_positions: int,
        linear: Matmul | None = None,
        weights: Weights | None = None,
        windows: Sequence[int | None] | None = None,
    ) -> None:
        """The matmuls run through `linear` (plain F.linear when None), see `use`. `weights`:
        given, `model` only lends its config and rotary embedding. `windows`: each layer's
        sliding window (as `attention_layers.inspect` found it), if any."""
        config = model.config
        decoder = model.model
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads or self.num_heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        )
        self.eps = float(config.rms_norm_eps)
        weights = weights or Weights.of(model)
        self.embed = weights.embed
        self.norm = weights.norm
        self.lm_head: Weight = weights.lm_head
        self.scale = self.head_dim**-0.5
        self.layers = weights.layers
        self.windows = list(windows or [None] * len(self.layers))
        self.intermediate = int(self.layers[0].down.shape[1])
        self.cos, self.sin = _rotary_table(
            decoder.rotary_emb, max_positions, self.norm, weights.dtype
        )
        self.one_dtype = self.cos.dtype == self.norm.dtype and all(
            w.dtype == self.norm.dtype
            for layer in self.layers
            for w in (layer.input_norm, layer.post_norm)
        )
        """Whether the rows (in the final norm's dtype), the norms and the rotary tables share
        one dtype: what the fused elementwise kernels (ops/fused.py) take."""
        self.use(linear or Matmul())

    def use(self, linear: Matmul) -> None:
        """Run every matmul through `linear`, on the weights `linear.prepare` makes of the
        current ones (once, at start-up: a packed plan replaces them), with the activation
        computed row by row (`rowwise`) when it keeps batch invariance. Quantized weights are
        left as they are (the runner's `quant.dispatching` sends them to their own kernels)."""
        self.linear: Linear = linear
        self.activation: Callable[[Tensor], Tensor] = (
            F.silu if linear.plan is None or not linear.plan.invariant else partial(rowwise, F.silu)
        )

        def prepare(weight: Weight) -> Weight:
            return linear.prepare(weight) if isinstance(weight, Tensor) else weight

        self.lm_head = prepare(self.lm_head)
        for layer in self.layers:
            layer.qkv, layer.o = prepare(layer.qkv), prepare(layer.o)
            layer.gate_up, layer.down = prepare(layer.gate_up), prepare(layer.down)

    @staticmethod
    def _fuse(layer: torch.nn.Module) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        bias = None
        if attn.q_proj.bias is not None:
            bias = torch.cat([p.bias.detach() for p in projections])
        return _Layer(
            input_norm=layer.input_layernorm.weight.detach(),
            qkv=torch.cat([p.weight.detach() for p in projections]),
            qkv_bias=bias,
            o=attn.o_proj.weight.detach(),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()]),
            down=mlp.down_proj.weight.detach(),
        )

    def __call__(
        self,
        input_ids: Tensor,
        positions: Tensor,
        attn: AttentionMetadata,
        k_caches: Sequence[Tensor],
        v_caches: Sequence[Tensor],
        lora: LoraBatch | None = None,
    ) -> Tensor:
        """Hidden states after the final norm, [T, hidden], for the packed row's tokens;
        `lora`: the step's adapter rows, if any."""
        linear = self.linear
        tokens = input_ids.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_end, k_end = hq * d, (hq + hkv) * d
        x = embedding(input_ids, self.embed).to(self.norm.dtype)  # bf16 rows of float32 models
        fuse = self.one_dtype and fused.usable(x)
        ops = _FusedOps(self, positions) if fuse else _EagerOps(self, positions)
        pending: Tensor | None = None  # the last layer's MLP output, added to x with the norm
        layers = zip(self.layers, self.windows, k_caches, v_caches, strict=True)
        for i, (layer, window, k_cache, v_cache) in enumerate(layers):
            t = i * len(LORA_PROJECTIONS)  # the layer's first LoRA target
            x, h = ops.add_norm(x, pending, layer.input_norm)
            qkv = linear(h, layer.qkv, layer.qkv_bias)
            if lora is not None:
                lora.add(t + _QKV, h, qkv)
            q, k = ops.rotate(qkv, tokens, k_end)
            v = qkv[:, k_end:].view(tokens, hkv, d)
            o = attn.forward(q, k, v, k_cache, v_cache, self.scale, window=window)
            o = o.reshape(tokens, q_end)
            out = linear(o, layer.o, None)
            if lora is not None:
                lora.add(t + _O, o, out)
            x, h = ops.add_norm(x, out, layer.post_norm)
            gate_up = linear(h, layer.gate_up, None)
            if lora is not None:
                lora.add(t + _GATE_UP, h, gate_up)
            act = ops.act(gate_up)
            pending = linear(act, layer.down, None)
            if lora is not None:
                lora.add(t + _DOWN, act, pending)
        return ops.add_norm(x, pending, self.norm)[1]

    def matrices(self) -> list[Weight]:
        """Every matrix a step multiplies by: each layer's four and the LM head."""
        return [
            *(w for layer in self.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)),
            self.lm_head,
        ]

    def _matrices(self) -> tuple[Weight, ...]:
        layer = self.layers[0]
        return (layer.qkv, layer.o, layer.gate_up, layer.down, self.lm_head)

    @property
    def quantized(self) -> bool:
        """Whether any matmul runs on quantized weights (which `linear` must dispatch)."""
        return any(is_quantized(w) for w in self._matrices())

    def weight_shapes(self) -> list[tuple[int, int]]:
        """(out_features, in_features) of every distinct float matmul, the LM head's included
        (quantized ones run on their own kernels, row-exact at any size)."""
        weights = (w for w in self._matrices() if not is_quantized(w))
        return list(dict.fromkeys((int(w.shape[0]), int(w.shape[1])) for w in weights))

    def logits(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden, self.lm_head, None)


class _EagerOps:
    """The layer's elementwise work as torch ops (transformers' own formulas)."""

    def __init__(self, forward: LlamaForward, positions: Tensor) -> None:
        self.forward = forward
        self.cos = forward.cos.index_select(0, positions).unsqueeze(1)  # [T, 1, D]
        self.sin = forward.sin.index_select(0, positions).unsqueeze(1)

    def add_norm(self, x: Tensor, out: Tensor | None, weight: Tensor) -> tuple[Tensor, Tensor]:
        """x + out (when given) and its RMS norm scaled by `weight`."""
        if out is not None:
            x = x + out
        return x, _rms_norm(x, weight, self.forward.eps)

    def rotate(self, qkv: Tensor, tokens: int, k_end: int) -> tuple[Tensor, Tensor]:
        """Queries and keys of `qkv` rotated, in one pass (half the ops of two; the same
        values)."""
        f = self.forward
        qk = _rotate(
            qkv[:, :k_end].view(tokens, f.num_heads + f.num_kv_heads, f.head_dim),
            self.cos,
            self.sin,
        )
        return qk[:, : f.num_heads], qk[:, f.num_heads :]

    def act(self, gate_up: Tensor) -> Tensor:
        n = self.forward.intermediate
        return self.forward.activation(gate_up[:, :n]) * gate_up[:, n:]


class _FusedOps:
    """The same work in ops/fused.py's kernels: x updated in place, keys rotated in `qkv`."""

    def __init__(self, forward: LlamaForward, positions: Tensor) -> None:
        self.forward = forward
        self.positions = positions.to(torch.int64).contiguous()

    def add_norm(self, x: Tensor, out: Tensor | None, weight: Tensor) -> tuple[Tensor, Tensor]:
        return x, fused.add_rms_norm(x, out, weight, self.forward.eps)

    def rotate(self, qkv: Tensor, tokens: int, k_end: int) -> tuple[Tensor, Tensor]:
        f = self.forward
        hq, hkv, d = f.num_heads, f.num_kv_heads, f.head_dim
        fused.rotate_(qkv, hq + hkv, d, f.cos, f.sin, self.positions)
        q = qkv[:, : hq * d].view(tokens, hq, d)
        return q, qkv[:, hq * d : k_end].view(tokens, hkv, d)

    def act(self, gate_up: Tensor) -> Tensor:
        return fused.silu_mul(gate_up)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' LlamaRMSNorm: normalized in float32, scaled in the model's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """transformers' apply_rotary_pos_emb on [T, H, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def _rotary_table(
    rotary: torch.nn.Module, max_positions: int, like: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos and sin for every position, [max_positions, D], exactly as the model's own rotary
    module gives them (the frequencies, their scaling, the cast to the model's dtype)."""
    positions = torch.arange(max_positions, device=like.device).unsqueeze(0)
    cos, sin = rotary(like.to(dtype), positions)
    return cos[0].contiguous(), sin[0].contiguous()
