"""A GGUF file's weights for the own forward, in the file's own formats (no float copy).

Why not through transformers: transformers reads a GGUF by dequantizing every tensor, which is
what made a lone stream read 270 MB of bf16 weights per token where llama.cpp reads the file's
85 MB. Here each tensor is read from the file (memory-mapped) and turned into the form its
format maps onto (`gguf_blocks`): Q4_0, Q4_1 and Q4_K into the int4 kernel's groups exactly,
Q8_0 layers into two exact int4 planes, a Q8_0 vocabulary and the other quantized formats into
int8 rows, float tensors into the activations' dtype. The
transformers model is then built without weights (on the meta device) and only lends its
config and rotary embedding to the forward.

Tensor names and the row order of the Q and K projections follow llama.cpp's converter: for the
`llama` architecture it interleaved each head's rotary halves, which is undone here by permuting
rows (whole rows, so it applies to quantized rows unchanged), as transformers does.
"""

from __future__ import annotations

import importlib.util
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from trio_llm.engine.models.llama import LlamaForward, Weights, _Layer
from trio_llm.engine.ops.f32_rows import F32BlockWeight, block_values
from trio_llm.engine.quant import gguf_blocks, gguf_file
from trio_llm.engine.quant.weights import (
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    kernel_dtype,
    quantize_int8,
    split_int8,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from trio_llm.model_files import ModelSource

log = logging.getLogger(__name__)

_PERMUTED_ARCHITECTURES = frozenset({"llama"})
"""GGUF architectures whose Q and K rows llama.cpp's converter interleaved."""


def gguf_path_of(source: ModelSource) -> Path | None:
    """The GGUF file a model source was converted from, if it was one."""
    from trio_llm import model_files
    from trio_llm.config import DEFAULT_MODEL

    origin = Path(source.origin)
    if origin.is_file() and origin.suffix.lower() == ".gguf":
        return origin
    if origin.is_dir() and not (origin / "config.json").is_file():
        found = sorted(origin.glob("*.gguf"))
        return found[0] if len(found) == 1 else None
    if source.origin == DEFAULT_MODEL and importlib.util.find_spec(
        model_files.DEFAULT_GGUF_PACKAGE
    ):
        return model_files.default_gguf_path()
    return None


def is_quantized_file(path: Path) -> bool:
    """Whether any of the file's matrices is stored in a quantized format."""
    tensors = gguf_file.read(path).tensors.values()
    return any(t.tensor_type not in gguf_blocks.FLOAT_FORMATS for t in tensors)


@dataclass(slots=True)
class _Int4Values:
    """A Q4 tensor unpacked, before packing: fused projections are packed as one (the kernel's
    packing tiles rows in blocks, so packed parts do not concatenate)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        group = self.q.shape[1] // self.scale.shape[1]
        scale = self.scale.repeat_interleave(group, 1)
        return (self.q.float() - 8) * scale + self.zero.repeat_interleave(group, 1)


@dataclass(slots=True)
class _Int8Blocks:
    """A Q8_0 tensor unpacked: `w = d * q` per group of 32."""

    q: torch.Tensor
    d: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.d.repeat_interleave(32, 1)


@dataclass(slots=True)
class _FloatBlocks:
    """A Q4_0, Q4_1 or Q8_0 tensor whose float32 values are asked for (`float_blocks`):
    `w = d * q (+ m)` per group of 32, as the `gguf` package computes it."""

    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None

    def dequantize(self) -> torch.Tensor:
        return block_values(self.q, self.d, self.m)


_Read = _Int4Values | _Int8Blocks | _FloatBlocks | Int8Weight | torch.Tensor


class GGUFWeights:
    """The file's tensors by name, each turned into what the forward multiplies by."""

    def __init__(self, path: Path, dtype: torch.dtype, *, float_blocks: bool = False) -> None:
        file = gguf_file.read(path)
        self.float_blocks = float_blocks
        """float32 values asked for (`--quantization none`): Q4_0, Q4_1 and Q8_0 matrices stay
        blocks the float32 kernel dequantizes exactly (`F32BlockWeight`), the other formats
        dense float32, the token table dense."""
        self.tensors = file.tensors
        self.architecture = file.architecture
        self.dtype = dtype
        """The activations' dtype: float tensors are read into it."""
        self.kernel_dtype = kernel_dtype(dtype)
        """What quantized weights' kernels multiply in (their scales' dtype)."""
        self.formats: Counter[str] = Counter()
        """How many tensors ran in which form, for the log and the tests."""

    def has(self, name: str) -> bool:
        return name in self.tensors

    def float(self, name: str) -> torch.Tensor:
        """A norm weight or bias, in the activations' dtype."""
        t = self.tensors[name]
        values = gguf_blocks.dequantize(t.tensor_type, t.data, (1, -1))[0]
        return values.to(self.dtype)

    def read(self, name: str, *, rows: np.ndarray | None = None) -> _Read:
        """A [out_features, in_features] weight in the form its format runs in; `rows`
        reorders its output rows."""
        t = self.tensors[name]
        kind = t.tensor_type
        out_features, in_features = int(t.shape[1]), int(t.shape[0])
        raw = t.data
        if rows is not None:
            raw = raw[rows]
        if self.float_blocks and kind in gguf_blocks.FLOAT_BLOCK_FORMATS:
            q, d, m = gguf_blocks.unpack_float_blocks(kind, raw)
            self.formats[f"{kind.name} as float32 from its blocks"] += 1
            return _FloatBlocks(
                torch.from_numpy(q), torch.from_numpy(d), None if m is None else torch.from_numpy(m)
            )
        if self.float_blocks and kind not in gguf_blocks.FLOAT_FORMATS:
            self.formats[f"{kind.name} as float32"] += 1
            return gguf_blocks.dequantize(kind, raw, (out_features, in_features))
        if kind in gguf_blocks.INT4_FORMATS:
            q, scale, zero = gguf_blocks.unpack_int4(kind, raw)
            self.formats[f"{kind.name} as int4"] += 1
            return _Int4Values(torch.from_numpy(q), torch.from_numpy(scale), torch.from_numpy(zero))
        if kind in gguf_blocks.SPLIT_FORMATS:
            q8, d = gguf_blocks.unpack_q8_0(raw)
            self.formats[f"{kind.name} as two int4 planes"] += 1
            return _Int8Blocks(torch.from_numpy(q8), torch.from_numpy(d))
        values = gguf_blocks.dequantize(kind, raw, (out_features, in_features))
        if kind in gguf_blocks.FLOAT_FORMATS:
            self.formats[f"{kind.name} as {str(self.dtype).removeprefix('torch.')}"] += 1
            return values.to(self.dtype)
        self.formats[f"{kind.name} as int8"] += 1
        return quantize_int8(values, self.kernel_dtype)

    def matrix(
        self, *names: str, rows: Sequence[np.ndarray | None] = ()
    ) -> QuantizedWeight | torch.Tensor:
        """The named projections fused along their output rows (QKV, gate-up) in one weight of
        one form; a file that gives them different formats (V in finer bits than Q and K, say)
        gets them as int8 rows, which hold each one's values to within half a step."""
        parts = [self.read(n, rows=r) for n, r in zip_longest(names, rows)]
        if self.float_blocks:
            return self._float_matrix(parts)
        if all(isinstance(p, _Int4Values) for p in parts):
            int4 = [p for p in parts if isinstance(p, _Int4Values)]
            if len({p.scale.shape[1] for p in int4}) == 1:
                return Int4Weight.pack(
                    torch.cat([p.q for p in int4]),
                    torch.cat([p.scale for p in int4]),
                    torch.cat([p.zero for p in int4]),
                    self.kernel_dtype,
                )
        if all(isinstance(p, _Int8Blocks) for p in parts):
            blocks = [p for p in parts if isinstance(p, _Int8Blocks)]
            return split_int8(
                torch.cat([p.q for p in blocks]),
                torch.cat([p.d for p in blocks]),
                self.kernel_dtype,
            )
        if all(isinstance(p, torch.Tensor) for p in parts):
            return torch.cat(parts)  # type: ignore[arg-type]
        int8 = [self._int8(p) for p in parts]
        return Int8Weight(torch.cat([p.q for p in int8]), torch.cat([p.scales for p in int8]))

    @staticmethod
    def _float_matrix(parts: Sequence[_Read]) -> F32BlockWeight | torch.Tensor:
        """Parts read with `float_blocks` as one float32 weight: blocks where every part is
        blocks of one kind (with offsets or without), else dense."""
        blocks = [p for p in parts if isinstance(p, _FloatBlocks)]
        if len(blocks) == len(parts) and len({p.m is None for p in blocks}) == 1:
            offsets = [p.m for p in blocks if p.m is not None]
            return F32BlockWeight.pack_blocks(
                torch.cat([p.q for p in blocks]),
                torch.cat([p.d for p in blocks]),
                torch.cat(offsets) if offsets else None,
            )
        dense = [p.dequantize() if isinstance(p, _FloatBlocks) else p for p in parts]
        return torch.cat(dense)  # type: ignore[arg-type]

    def table(self, name: str) -> torch.Tensor:
        """The token table as dense float32 rows (`float_blocks`): what the embedding reads a
        few rows of a step."""
        t = self.tensors[name]
        self.formats[f"{t.tensor_type.name} token table as float32"] += 1
        shape = (int(t.shape[1]), int(t.shape[0]))
        return gguf_blocks.dequantize(t.tensor_type, t.data, shape).to(self.dtype)

    def vocabulary(self, name: str) -> QuantizedWeight | torch.Tensor:
        """The embedding table or LM head: a Q8_0 one as int8 rows rather than two int4
        planes. Its one matmul a step is the largest of the model, and the planes cost 4.8 ms
        a step against the rows' 1.6 (bench/results/decode_profile.md) for 0.5% of perplexity
        on the default file (+0.31% against llama.cpp's, -0.16% with planes)."""
        weight = self.read(name)
        if isinstance(weight, _Int8Blocks):
            self.formats[f"{self.tensors[name].tensor_type.name} as two int4 planes"] -= 1
            self.formats[f"{self.tensors[name].tensor_type.name} as int8 rows"] += 1
            return self._int8(weight)
        return self.matrix(name)

    def _int8(self, weight: _Read) -> Int8Weight:
        if isinstance(weight, Int8Weight):
            return weight
        if isinstance(weight, _Int4Values | _Int8Blocks):
            return quantize_int8(weight.dequantize(), self.kernel_dtype)
        return quantize_int8(weight, self.kernel_dtype)


def _interleave_rows(out_features: int, heads: int) -> np.ndarray:
    """The rows of llama.cpp's Q/K layout in transformers' order (its reverse_permute)."""
    half = out_features // heads // 2
    return np.arange(out_features).reshape(heads, half, 2).swapaxes(1, 2).reshape(-1)


def load_weights(
    path: Path, config: PretrainedConfig, dtype: torch.dtype, *, float_blocks: bool = False
) -> Weights:
    """The forward's weights from the GGUF file at `path`, in its own formats; with
    `float_blocks`, as float32 values (`GGUFWeights.float_blocks`)."""
    g = GGUFWeights(path, dtype, float_blocks=float_blocks)
    heads = int(config.num_attention_heads)
    kv_heads = int(config.num_key_value_heads or heads)
    permute = g.architecture in _PERMUTED_ARCHITECTURES
    layers = []
    for i in range(int(config.num_hidden_layers)):
        p = f"blk.{i}."
        q_rows = k_rows = None
        if permute:
            q_rows = _interleave_rows(int(g.tensors[p + "attn_q.weight"].shape[1]), heads)
            k_rows = _interleave_rows(int(g.tensors[p + "attn_k.weight"].shape[1]), kv_heads)
        bias = None
        if g.has(p + "attn_q.bias"):
            bias = torch.cat([g.float(p + f"attn_{n}.bias") for n in "qkv"])
        layers.append(
            _Layer(
                input_norm=g.float(p + "attn_norm.weight"),
                qkv=g.matrix(  # type: ignore[arg-type]
                    p + "attn_q.weight",
                    p + "attn_k.weight",
                    p + "attn_v.weight",
                    rows=(q_rows, k_rows),
                ),
                qkv_bias=bias,
                o=g.matrix(p + "attn_output.weight"),  # type: ignore[arg-type]
                post_norm=g.float(p + "ffn_norm.weight"),
                gate_up=g.matrix(p + "ffn_gate.weight", p + "ffn_up.weight"),  # type: ignore[arg-type]
                down=g.matrix(p + "ffn_down.weight"),  # type: ignore[arg-type]
            )
        )
    if float_blocks:
        tied = not g.has("output.weight")
        head = g.matrix("token_embd.weight" if tied else "output.weight")
        # A tied table that is not blocks is dense already: the embedding reads that one.
        embed = head if tied and isinstance(head, torch.Tensor) else g.table("token_embd.weight")
    else:
        embed = g.vocabulary("token_embd.weight")
        head = g.vocabulary("output.weight") if g.has("output.weight") else embed
    log.info(
        "%s runs in %s: %s",
        path.name,
        "float32, its block formats dequantized in the kernel"
        if float_blocks
        else "its own formats",
        ", ".join(f"{n} {k}" for k, n in sorted(g.formats.items()) if n),
    )
    return Weights(
        embed=embed,  # type: ignore[arg-type]
        norm=g.float("output_norm.weight"),
        lm_head=head,  # type: ignore[arg-type]
        layers=layers,
        dtype=dtype,
    )


def weights_nbytes(forward: LlamaForward) -> int:
    """Bytes of every weight the forward holds, a shared (tied) one counted once."""
    seen: dict[int, int] = {}
    tensors: list[object] = [forward.embed, forward.norm, forward.lm_head]
    for layer in forward.layers:
        tensors += [
            layer.input_norm,
            layer.qkv,
            layer.qkv_bias,
            layer.o,
            layer.post_norm,
            layer.gate_up,
            layer.down,
        ]
    for t in tensors:
        if t is None:
            continue
        size = t.nbytes if not isinstance(t, torch.Tensor) else t.numel() * t.element_size()
        seen[id(t)] = int(size)
    return sum(seen.values())
