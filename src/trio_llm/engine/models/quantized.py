"""Which of a model's weights run quantized, and putting them into the own forward: the plan
made at start-up (`plan`: a GGUF file in its own formats, a float checkpoint quantized at load,
or float), the model without weights that a GGUF's forward takes its config and rotary
embedding from (`meta_model`), and the forward's matrices replaced by quantized ones
(`quantize_forward`). The formats and kernels themselves are engine/quant's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from trio_llm.engine import attention
from trio_llm.engine.models import llama, loader
from trio_llm.engine.models.gguf_weights import gguf_path_of, is_quantized_file
from trio_llm.engine.ops import f32_rows
from trio_llm.engine.quant import (
    Int8Weight,
    QuantizedWeight,
    is_quantized,
    kernel_dtype,
    quantize_int4,
    quantize_int8,
)

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import PretrainedConfig

    from trio_llm.engine.models.llama import LlamaForward
    from trio_llm.model_files import ModelSource

log = logging.getLogger(__name__)

QUANTIZATIONS = ("auto", "none", "int8", "int4", "w8a8")
"""auto: a quantized GGUF file runs in its own formats, a float checkpoint in its float dtype;
none: every weight dequantized to the float dtype (what transformers' GGUF reader gives; in
float32 on the own forward the same values, the file's Q4_0, Q4_1 and Q8_0 blocks kept and
dequantized by the float32 kernel as it multiplies);
int8 / int4: the linear layers quantized at load (int8 per row; int4 in groups of 32), the
LM head and embeddings in int8; w8a8: every matrix in int8 per row (a GGUF's values requantized)
multiplied by int8 activations (`Int8Weight.int8_activations`)."""
AT_LOAD = ("int8", "int4", "w8a8")
"""The quantizations applied to the own forward's weights at start-up (`quantize_forward`)."""


def plan(
    quantization: str,
    source: ModelSource,
    config: PretrainedConfig,
    device: str,
    model_impl: str,
    dtype: torch.dtype | None = None,
) -> tuple[str, Path | None]:
    """How this model's weights run: ("gguf", its file) on the own forward, ("gguf-modules",
    its file) in transformers' modules (models/gguf_modules.py: the families the own forward
    does not compute), ("gguf-float32", its file) the file's float32 values on the own forward
    (`none` in float32: `gguf_weights.GGUFWeights.float_blocks`), ("int8" | "int4", None), or
    ("none", None). Quantized weights need a CPU (their kernels are CPU ones), and quantizing
    at load the own forward; elsewhere `auto` keeps the float path and an explicit request is
    refused."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use {', '.join(QUANTIZATIONS)}")
    runnable = (
        device == "cpu"
        and model_impl in ("auto", "own")
        and bool(set(getattr(config, "architectures", None) or ()) & llama.ARCHITECTURES)
    )
    if quantization == "none":
        # The same values as the dense copy transformers' reader makes, a quarter of the bytes.
        path = gguf_path_of(source) if runnable and dtype is torch.float32 else None
        if path is not None and f32_rows.keeps_blocks() and is_quantized_file(path):
            return "gguf-float32", path
        return "none", None
    if quantization in AT_LOAD:
        if not runnable:
            raise ValueError(
                f"--quantization {quantization} runs on a CPU with the engine's own forward "
                f"(architectures {', '.join(sorted(llama.ARCHITECTURES))}, --model-impl auto "
                "or own)"
            )
        path = gguf_path_of(source) if quantization == "w8a8" else None
        return quantization, path if path is not None and is_quantized_file(path) else None
    path = gguf_path_of(source)
    if path is None or device != "cpu" or not is_quantized_file(path):
        return "none", None
    return ("gguf" if runnable else "gguf-modules"), path


def activation_dtype(dtype: str) -> torch.dtype:
    """bfloat16 unless asked otherwise. With float32 asked for, the activations between the
    matmuls are float32 and the quantized matmuls take bf16 inputs (`quant.kernel_dtype`):
    their float32 paths are not vectorized (15x slower measured)."""
    return torch.bfloat16 if dtype == "auto" else loader.resolve_dtype(dtype, "cpu")


def meta_model(source: ModelSource, dtype: torch.dtype) -> torch.nn.Module:
    """The transformers model without weights (meta device): the own forward takes its
    config and rotary embedding, which is rebuilt on the CPU."""
    from transformers import AutoModelForCausalLM

    config = loader.load_config(source)
    attention.register()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attention.ATTN_IMPLEMENTATION
        )
    decoder = model.model
    with torch.device("cpu"):
        decoder.rotary_emb = type(decoder.rotary_emb)(config=model.config)
    return model.eval()


def quantize_forward(forward: LlamaForward, kind: str) -> None:
    """Replace the forward's matrices by quantized ones: `kind` int8 or int4 for the layers,
    the LM head and embeddings in int8 (one copy when they are tied); w8a8 for all of them,
    from float or already quantized (a GGUF's) weights."""
    dtype = kernel_dtype(forward.norm.dtype)
    w8a8 = kind == "w8a8"

    def layer_quantize(weight: Tensor | QuantizedWeight) -> QuantizedWeight:
        if is_quantized(weight):
            weight = weight.dequantize()  # type: ignore[union-attr]
        if kind == "int4":
            return quantize_int4(weight, dtype)  # type: ignore[arg-type]
        return quantize_int8(weight, dtype, int8_activations=w8a8)  # type: ignore[arg-type]

    for layer in forward.layers:
        layer.qkv = layer_quantize(layer.qkv)  # type: ignore[assignment]
        layer.o = layer_quantize(layer.o)  # type: ignore[assignment]
        layer.gate_up = layer_quantize(layer.gate_up)  # type: ignore[assignment]
        layer.down = layer_quantize(layer.down)  # type: ignore[assignment]
    tied = forward.embed is forward.lm_head or (
        isinstance(forward.embed, torch.Tensor)
        and isinstance(forward.lm_head, torch.Tensor)
        and forward.embed.data_ptr() == forward.lm_head.data_ptr()
    )
    head = forward.lm_head
    if not isinstance(head, Int8Weight):
        head = quantize_int8(
            head.dequantize() if is_quantized(head) else head,  # type: ignore[union-attr,arg-type]
            dtype,
        )
    head.int8_activations = w8a8
    forward.lm_head = head  # type: ignore[assignment]
    if tied:
        forward.embed = head  # type: ignore[assignment]
    elif not isinstance(forward.embed, Int8Weight):
        forward.embed = quantize_int8(forward.embed, dtype)  # type: ignore[assignment]
    log.info("weights quantized at load: %s (LM head and embeddings int8)", kind)
