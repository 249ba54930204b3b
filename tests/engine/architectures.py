"""Tiny random-weight models of the decoder architectures people run, built from transformers'
own config classes: two layers, hidden 64, a vocabulary of 1000 (the tests feed token ids, no
tokenizer), with each family's peculiarity switched on at a size a short prompt reaches (sliding
windows of 16 tokens beside full layers, soft-capping, logit and residual scaling, partial
rotary, experts routed top-2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

VOCAB = 1000
WINDOW = 16
"""The sliding window of the tiny models that have one: shorter than the test prompts."""

_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    # A wide init spreads the logits, so greedy picks are rarely near-ties that packed and
    # unpacked batches could round differently.
    "initializer_range": 0.2,
    # An LM head tied to the embeddings makes a random model repeat its last token whatever it
    # attends to: a test of attention would then pass without any.
    "tie_word_embeddings": False,
    **_IDS,
}


def _config(name: str, **overrides: Any) -> Any:
    import transformers

    return getattr(transformers, name)(**{**COMMON, **overrides})


CONFIGS: dict[str, Callable[[], Any]] = {
    "llama": lambda: _config("LlamaConfig", head_dim=16),
    "qwen2": lambda: _config("Qwen2Config"),
    "qwen3": lambda: _config("Qwen3Config", head_dim=16),
    "mistral": lambda: _config("MistralConfig", sliding_window=WINDOW),
    "gemma2": lambda: _config(
        "Gemma2Config",
        head_dim=16,
        sliding_window=WINDOW,
        query_pre_attn_scalar=16,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
    ),
    "gemma3": lambda: _config(
        "Gemma3TextConfig",
        head_dim=32,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
    ),
    # Its global layers have twice the head dim of its local ones: caches of two shapes.
    "gemma4": lambda: _config(
        "Gemma4TextConfig",
        head_dim=16,
        global_head_dim=32,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        vocab_size_per_layer_input=VOCAB,
        hidden_size_per_layer_input=8,
    ),
    "phi3": lambda: _config("Phi3Config", sliding_window=WINDOW),
    "olmo2": lambda: _config("Olmo2Config"),
    "granite": lambda: _config(
        "GraniteConfig",
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.2,
        logits_scaling=4.0,
    ),
    "gpt2": lambda: _config("GPT2Config", n_embd=64, n_layer=2, n_head=4, n_positions=512),
    # OPT's causal LM calls its base model's `decoder`: the logits' stand-in must answer it.
    "opt": lambda: _config("OPTConfig", ffn_dim=128, word_embed_proj_dim=64),
    "gpt_neox": lambda: _config("GPTNeoXConfig", rotary_pct=0.5),
    "qwen3_moe": lambda: _config(
        "Qwen3MoeConfig",
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    ),
    "mixtral": lambda: _config("MixtralConfig", num_local_experts=4, num_experts_per_tok=2),
    "olmoe": lambda: _config(
        "OlmoeConfig", num_experts=8, num_experts_per_tok=2, intermediate_size=32
    ),
}


def build(name: str, path: Path, *, seed: int = 0) -> torch.nn.Module:
    """Save the tiny `name` model as a Hugging Face directory at `path`; the model back, in
    float32 and eval mode."""
    from transformers import AutoModelForCausalLM

    config = CONFIGS[name]()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(path)
    return model
