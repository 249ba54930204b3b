"""A GGUF file of each architecture the engine serves loads as its Hugging Face directory does:
the tiny model of `architectures.CONFIGS`, written as llama.cpp's converter writes it
(`gguf_writer`), resolved (converted once) and served by the engine, gives transformers' greedy
tokens on the original model.

Where llama.cpp's format cannot hold what the tiny model has, the model is made as llama.cpp's
checkpoints of that family are: Gemma 2 ties its LM head, Gemma 3 has its default layer pattern,
Mistral has no sliding window (a `llama` GGUF holds none), Qwen3-MoE normalizes its top-k
weights. Gemma 4 is left out: this writer was not checked against llama.cpp's converter for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from architectures import CONFIGS, VOCAB
from engine_helpers import hf_greedy, make_core, random_prompts, request, run
from gguf_writer import write

from trio_llm import model_files

PROMPTS = random_prompts([5, 40], seed=11, vocab=VOCAB)
NEW_TOKENS = 8
AS_LLAMA_CPP_HAS_THEM = {
    "gemma2": {"tie_word_embeddings": True},
    "gemma3": {"layer_types": None},
    "mistral": {"sliding_window": None},
    "qwen3_moe": {"norm_topk_prob": True},
}


@pytest.fixture(scope="module")
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trio-llm-cache")


@pytest.mark.parametrize("name", sorted(set(CONFIGS) - {"gemma4", "opt"}))
def test_a_gguf_serves_what_its_hugging_face_directory_does(
    name: str,
    tmp_path: Path,
    isolated_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("TRIO_LLM_CACHE", str(isolated_cache))
    config = CONFIGS[name]()
    # Rebuilt from its fields, so that derived ones (Gemma 3's layer types) follow.
    config = type(config)(**{**config.to_dict(), **AS_LLAMA_CPP_HAS_THEM.get(name, {})})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    expected = [hf_greedy(model, p, NEW_TOKENS) for p in PROMPTS]
    gguf = write(model, tmp_path / f"{name}.gguf", model_files.default_gguf_path())

    source = model_files.resolve_model(str(gguf))
    core = make_core(source.path)
    got = run(core, [request(str(i), p, max_tokens=NEW_TOKENS) for i, p in enumerate(PROMPTS)])
    assert [got[str(i)].token_ids for i in range(len(PROMPTS))] == expected
    # The same class (a Mixtral is no Llama), but for a Mistral: transformers reads a `llama`
    # GGUF as one only when its name says Mistral; without a window the two compute the same.
    if name != "mistral":
        assert type(core.runner.model).__name__ == type(model).__name__
