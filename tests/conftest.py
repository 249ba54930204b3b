"""Suite-wide fixtures: the models tests run on.

`tiny_model_dir` is a random-weight Llama (2 layers, hidden 64) saved as a Hugging Face
directory with the default model's real tokenizer, so tests get real text handling (chat
template, multi-byte tokens) at a fraction of the real model's cost. `default_model` is the
real SmolLM2-135M-Instruct, for the few tests that check real text.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trio_llm.model_files import ModelSource, load_tokenizer, resolve_model


def build_tiny_llama(path: Path, tokenizer_source: ModelSource, *, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_source)
    config = LlamaConfig(
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
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def default_model() -> ModelSource:
    """The real default model (converted from its GGUF once per machine)."""
    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer_source() -> ModelSource:
    """The tokenizer the tiny models get: the default model's, or the directory that
    TRIO_LLM_TEST_TOKENIZER names (the GPU check's copy: the default model's GGUF cannot travel
    to the device machine)."""
    directory = os.environ.get("TRIO_LLM_TEST_TOKENIZER")
    if directory:
        return ModelSource(name="tokenizer", path=Path(directory), origin=directory)
    return resolve_model(None)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tokenizer_source)
