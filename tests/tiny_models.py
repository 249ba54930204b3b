"""Random-weight decoders for tests: real architectures at a fraction of a real model's cost,
saved as Hugging Face directories the loader reads like any model's."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_tiny_model(
    path: Path, tokenizer: Any, config_class: Any, model_class: Any, *, seed: int = 0
) -> Path:
    """A random-weight decoder of `config_class` (2 layers, hidden 64) saved as a Hugging Face
    directory with `tokenizer`."""
    import torch

    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # A wide init spreads the logits, so greedy picks are rarely near-ties that packed and
        # unpacked batches could round differently.
        initializer_range=0.2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
