"""llama.cpp's GGUF names for architectures transformers' GGUF loader lacks or reads in part.

A GGUF file is converted once into a Hugging Face directory by transformers' own GGUF loader
(`model_files._convert_gguf`), which maps llama.cpp's metadata keys to config fields and its
tensor names to the model's parameters through tables, one entry per architecture. Some of the
architectures the engine serves are missing there (OLMo 2, OLMoE, Granite, GPT-NeoX), and some
are read in part, which loads a model that runs but computes something else:

- a Mixtral GGUF is llama.cpp's `llama` architecture with `expert_count` experts: transformers
  builds a dense Llama and drops the experts;
- GPT-2's `context_length` lands in `n_ctx`, which transformers' GPT-2 no longer reads (its
  position table is `n_positions` long); Qwen3's `key_length` (the head dim) and Qwen3-MoE's
  `expert_feed_forward_length` (each expert's width) are not read;
- Gemma 2's score and logit soft-caps are not read (the config's defaults stand in), nor
  Phi-3's sliding window (Phi-3-mini-4k attends over 2047 tokens; without it, over all).

What a GGUF does not hold cannot be recovered: llama.cpp writes no sliding window for a Mistral
(its `llama` architecture has none) and no layer pattern for a Gemma 3 (it assumes five local
layers to one global), and it takes a Qwen3-MoE's top-k weights as normalized.

`extend_transformers` adds those entries to transformers' tables (once per process), following
what llama.cpp's `convert_hf_to_gguf.py` writes for each architecture (its metadata keys, and the
tensor reorderings to undo: Llama's rotary permutation of q and k, GPT-NeoX's per-head fused
QKV, experts stacked per projection).
"""

from __future__ import annotations

import re
from typing import Any

_LLAMA_LIKE: dict[str, str | None] = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.dimension_count": None,
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "vocab_size": "vocab_size",
}
_EXPERTS = {"expert_count": "num_experts", "expert_used_count": "num_experts_per_tok"}

NEW_ARCHITECTURES: dict[str, dict[str, str | None]] = {
    "olmo2": _LLAMA_LIKE,
    "olmoe": {**_LLAMA_LIKE, **_EXPERTS},
    "granite": {
        **_LLAMA_LIKE,
        "attention.scale": "attention_multiplier",
        "embedding_scale": "embedding_multiplier",
        "residual_scale": "residual_multiplier",
        "logit_scale": "logits_scaling",
    },
    "gptneox": {
        "context_length": "max_position_embeddings",
        "block_count": "num_hidden_layers",
        "feed_forward_length": "intermediate_size",
        "embedding_length": "hidden_size",
        "rope.dimension_count": "rotary_dimensions",
        "rope.freq_base": "rope_theta",
        "attention.head_count": "num_attention_heads",
        "attention.layer_norm_epsilon": "layer_norm_eps",
        "use_parallel_residual": "use_parallel_residual",
        "vocab_size": "vocab_size",
    },
}
"""llama.cpp architecture -> {its metadata key (after the architecture's prefix): config field}."""

MORE_KEYS: dict[str, dict[str, str | None]] = {
    "gpt2": {"context_length": "n_positions"},
    "qwen3": {"attention.key_length": "head_dim", "attention.value_length": None},
    "qwen3_moe": {
        "attention.value_length": None,
        "expert_feed_forward_length": "moe_intermediate_size",
    },
    "gemma2": {
        "attn_logit_softcapping": "attn_logit_softcapping",
        "final_logit_softcapping": "final_logit_softcapping",
    },
    "llama": {"expert_count": "num_local_experts", "expert_used_count": "num_experts_per_tok"},
    "phi3": {
        "attention.sliding_window": "sliding_window",
        "rope.scaling.original_context_length": "original_max_position_embeddings",
    },
}
"""Keys transformers' existing entries miss."""

_MODEL_TYPES = {"gptneox": "gpt_neox"}
"""llama.cpp architecture -> transformers model type, where the names differ."""
_GGUF_NAMES = {"gpt_neox": "gptneox", "mixtral": "llama"}
"""transformers model type -> the llama.cpp architecture whose tensor names it has."""

_extended = False


def extend_transformers() -> None:
    """Add this module's entries to transformers' GGUF tables (idempotent)."""
    global _extended
    if _extended:
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.integrations import ggml

    config_table = ggml.GGUF_CONFIG_MAPPING
    for arch, keys in NEW_ARCHITECTURES.items():
        config_table[arch] = dict(keys)
        if arch not in gguf_utils.GGUF_SUPPORTED_ARCHITECTURES:
            gguf_utils.GGUF_SUPPORTED_ARCHITECTURES.append(arch)
    for arch, keys in MORE_KEYS.items():
        config_table.setdefault(arch, {}).update(keys)
    processors = gguf_utils.TENSOR_PROCESSORS
    processors["llama"] = _llama_processor(gguf_utils)
    processors["granite"] = gguf_utils.LlamaTensorProcessor
    processors["olmoe"] = gguf_utils.Qwen2MoeTensorProcessor
    processors["gptneox"] = _gpt_neox_processor(gguf_utils)
    _wrap_loading(gguf_utils)
    _extended = True


def _wrap_loading(gguf_utils: Any) -> None:
    """The model type a GGUF's metadata implies where llama.cpp's architecture does not say it
    (Mixtral is `llama` with experts; GPT-NeoX is `gptneox`), and llama.cpp's tensor names for
    those model types."""
    load = gguf_utils.load_gguf_checkpoint
    weights_map = gguf_utils.get_gguf_hf_weights_map

    def load_gguf_checkpoint(*args: Any, **kwargs: Any) -> dict[str, Any]:
        parsed = load(*args, **kwargs)
        config = parsed.get("config", {})
        model_type = config.get("model_type")
        config["model_type"] = _MODEL_TYPES.get(model_type, model_type)
        if config["model_type"] == "llama" and config.get("num_local_experts"):
            config["model_type"] = "mixtral"
        if config["model_type"] == "gpt_neox" and config.get("rotary_dimensions"):
            head_dim = config["hidden_size"] // config["num_attention_heads"]
            config["partial_rotary_factor"] = config.pop("rotary_dimensions") / head_dim
            config["rotary_pct"] = config["partial_rotary_factor"]
        return parsed

    def get_gguf_hf_weights_map(hf_model: Any, processor: Any, model_type: str | None = None,
                                *args: Any, **kwargs: Any) -> dict[str, str]:  # fmt: skip
        model_type = model_type or hf_model.config.model_type
        return weights_map(hf_model, processor, _GGUF_NAMES.get(model_type, model_type), *args,
                           **kwargs)  # fmt: skip

    gguf_utils.load_gguf_checkpoint = load_gguf_checkpoint
    gguf_utils.get_gguf_hf_weights_map = get_gguf_hf_weights_map


def _llama_processor(gguf_utils: Any) -> type:
    """Llama's processor (q and k un-permuted) that also stacks a Mixtral's experts."""

    class LlamaTensorProcessor(gguf_utils.LlamaTensorProcessor, gguf_utils.Qwen2MoeTensorProcessor):
        def process(self, weights: Any, name: str, **kwargs: Any) -> Any:
            if re.fullmatch(self.GGUF_MOE_WEIGHTS_PATTERN, name):
                return gguf_utils.Qwen2MoeTensorProcessor.process(self, weights, name, **kwargs)
            return gguf_utils.LlamaTensorProcessor.process(self, weights, name, **kwargs)

    return LlamaTensorProcessor


def _gpt_neox_processor(gguf_utils: Any) -> type:
    """GPT-NeoX's fused QKV back in transformers' order: llama.cpp stores all heads' queries,
    then keys, then values; transformers interleaves them per head."""

    class GptNeoXTensorProcessor(gguf_utils.TensorProcessor):
        def process(self, weights: Any, name: str, **kwargs: Any) -> Any:
            if ".attn_qkv." in name:
                heads = self.config["num_attention_heads"]
                rest = weights.shape[1:]
                weights = (
                    weights.reshape(3, heads, -1, *rest).swapaxes(0, 1).reshape(-1, *rest).copy()
                )
            return gguf_utils.GGUFTensor(weights, name, {})

    return GptNeoXTensorProcessor
