"""Write a Hugging Face model as llama.cpp's `convert_hf_to_gguf.py` writes it (float32): the
architecture's metadata keys, its tensors under llama.cpp's names, and the reorderings llama.cpp
applies (Llama's rotary permutation of q and k, Gemma's norms stored as 1 + w, GPT-2's Conv1D
weights transposed, GPT-NeoX's fused QKV regrouped, experts split and stacked per projection),
with the tokenizer of the default model's GGUF (cut to the model's vocabulary). It was checked
against that converter's output for these tiny models (tensor names, shapes and values, and the
metadata), so a GGUF it writes stands for one people download."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "granite": "granite",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "olmo2": "olmo2",
    "olmoe": "olmoe",
    "gpt2": "gpt2",
    "gpt_neox": "gptneox",
}
"""transformers model type -> llama.cpp architecture."""
_PERMUTED = {"llama", "granite"}
"""llama.cpp architectures whose q and k rows llama.cpp permutes for its rotary layout."""


def write(
    model: torch.nn.Module,
    path: Path,
    tokenizer_gguf: Path,
    matrices: Any = None,
    embedding: bool = False,
) -> Path:
    """`matrices`: a gguf.GGMLQuantizationType the matrices are stored in (the norms stay
    float); None: F32. `embedding`: the token table in that type too, as llama.cpp's quantize
    writes it (the default model's file holds it in Q8_0); else float."""
    import gguf

    config = model.config
    arch = ARCH[config.model_type]
    writer = gguf.GGUFWriter(path, arch)
    # transformers takes a `llama` GGUF named like Mistral for a Mistral.
    writer.add_name(config.model_type.capitalize())
    _metadata(writer, config, arch)
    _tokenizer(writer, tokenizer_gguf, config.vocab_size)
    key = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(key, config.num_hidden_layers)
    for name, tensor in model.state_dict().items():
        for gguf_name, data in _tensors(name, tensor.detach().float(), config, arch, names):
            values = np.ascontiguousarray(data.numpy())
            if matrices is not None and _quantizable(gguf_name, values, embedding):
                quantized = gguf.quants.quantize(values, matrices)
                writer.add_tensor(gguf_name, quantized, raw_dtype=matrices)
            else:
                writer.add_tensor(gguf_name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _quantizable(name: str, values: np.ndarray, embedding: bool) -> bool:
    return (
        values.ndim in (2, 3)  # 3: a mixture's expert stacks
        and values.shape[-1] % 32 == 0
        and name.endswith(".weight")
        and (embedding or not name.startswith("token_embd"))
    )


def _metadata(writer: Any, config: Any, arch: str) -> None:
    get = config.__dict__.get
    heads = config.num_attention_heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(heads)
    if arch == "gpt2":
        writer.add_feed_forward_length(get("n_inner") or 4 * config.hidden_size)
        writer.add_layer_norm_eps(config.layer_norm_epsilon)
        return
    if arch == "gptneox":
        writer.add_feed_forward_length(config.intermediate_size)
        factor = config.rope_parameters.get("partial_rotary_factor", 1.0)
        writer.add_rope_dimension_count(int(factor * (config.hidden_size // heads)))
        writer.add_parallel_residual(config.use_parallel_residual)
        writer.add_layer_norm_eps(config.layer_norm_eps)
        return
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    if arch == "gemma3":  # one rotary embedding per layer type
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    elif arch == "phi3":
        writer.add_rope_dimension_count(config.hidden_size // heads)
        writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
        writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
    elif arch != "gemma2":
        writer.add_rope_freq_base(rope.get("rope_theta", 10000.0))
    if arch in _PERMUTED:
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(config.hidden_size // heads)
        if get("head_dim"):
            writer.add_key_length(config.head_dim)
            writer.add_value_length(config.head_dim)
    moe = get("num_local_experts") or get("num_experts")
    if moe:
        writer.add_expert_count(moe)
        writer.add_expert_used_count(config.num_experts_per_tok)
    if arch == "qwen3moe":
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    else:
        writer.add_feed_forward_length(config.intermediate_size)
    if arch in ("gemma2", "gemma3", "qwen3", "qwen3moe"):
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    if arch in ("gemma2", "gemma3", "phi3") and get("sliding_window"):
        writer.add_sliding_window(config.sliding_window)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
        writer.add_final_logit_softcapping(config.final_logit_softcapping)
    if arch == "granite":
        writer.add_attention_scale(config.attention_multiplier)
        writer.add_embedding_scale(config.embedding_multiplier)
        writer.add_residual_scale(config.residual_multiplier)
        writer.add_logit_scale(config.logits_scaling)


def _tokenizer(writer: Any, source: Path, vocab: int) -> None:
    """`source`'s tokenizer cut to its first `vocab` tokens and the merges among them (a BPE
    vocabulary lists tokens in merge order, so the cut is a smaller BPE tokenizer): reading
    the full 49k vocabulary back costs seconds per conversion."""
    import gguf

    reader = gguf.GGUFReader(source)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    kept = set(tokens)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = value[:vocab]
        elif key == "tokenizer.ggml.merges":
            value = [
                m for m in value if all(p in kept for p in [*m.split(" "), m.replace(" ", "")])
            ]
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)


def _tensors(
    name: str, data: torch.Tensor, config: Any, arch: str, names: Any
) -> list[tuple[str, torch.Tensor]]:
    base, _, suffix = name.rpartition(".")
    if arch == "gemma2" and name == "lm_head.weight":
        return []  # llama.cpp's Gemma 2 always ties its LM head to the embeddings
    if name.endswith("experts.gate_up_proj"):  # [E, 2I, H]: llama.cpp stacks gate and up apart
        block = name.split(".")[2]
        gate, up = data.chunk(2, dim=1)
        return [
            (f"blk.{block}.ffn_gate_exps.weight", gate),
            (f"blk.{block}.ffn_up_exps.weight", up),
        ]
    if name.endswith("experts.down_proj"):
        return [(f"blk.{name.split('.')[2]}.ffn_down_exps.weight", data)]
    mapped = names.get_name(base)
    if mapped is None:
        raise KeyError(f"no llama.cpp name for {name} ({arch})")
    gguf_name = f"{mapped}.{suffix}"
    if arch in _PERMUTED and base.endswith(("q_proj", "k_proj")):
        heads = (
            config.num_attention_heads if base.endswith("q_proj") else config.num_key_value_heads
        )
        data = _permute(data, heads)
    if arch in ("gemma2", "gemma3") and "norm" in base:
        data = data + 1
    if arch == "gpt2" and suffix == "weight" and base.endswith(("c_attn", "c_proj", "c_fc")):
        data = data.T  # Conv1D keeps [in, out]
    if arch == "gptneox" and base.endswith("query_key_value"):
        heads = config.num_attention_heads
        data = data.reshape(heads, 3, -1, *data.shape[1:]).transpose(0, 1).reshape(data.shape)
    return [(gguf_name, data.contiguous())]


def _permute(weights: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute: each head's rotary halves interleaved."""
    shape = weights.shape
    return (
        weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)
    )
