"""Suite-wide fixtures: the models tests run on.

`tiny_model_dir` is a random-weight Llama (2 layers, hidden 64) saved as a Hugging Face
directory with the default model's real tokenizer, so tests get real text handling (chat
template, multi-byte tokens) at a fraction of the real model's cost. `default_model` is the
real SmolLM2-135M-Instruct, for the few tests that check real text.
"""

from __future__ import annotations

import os
from pathlib import Path

# Batch invariance in float32 needs MKL's reproducibility mode, which MKL takes only before its
# first call: the engine process sets it first thing, and in-process engines here find it set
# (engine/plans/invariance.py).
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest
from hypothesis import settings

from tiny_models import build_tiny_model
from trio_llm.model_files import ModelSource, load_tokenizer, resolve_model

# Every Hypothesis test runs derandomized unless TRIO_LLM_FUZZ says otherwise (fuzz_bodies.py):
# the suite is green or red for a reason, not by the seed it drew.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("random", derandomize=False, database=None, print_blob=True)
settings.register_profile("deep", derandomize=False, database=None, print_blob=True)
settings.load_profile(
    {"random": "random", "deep": "deep"}.get(os.environ.get("TRIO_LLM_FUZZ", ""), "ci")
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The deep fuzz mode runs each test for as long as its examples take: no per-test
    timeout (pyproject's 300 s is sized for the derandomized examples)."""
    if os.environ.get("TRIO_LLM_FUZZ") == "deep":
        for item in items:
            item.add_marker(pytest.mark.timeout(0))


def build_tiny_llama(
    path: Path, tokenizer_source: ModelSource, *, seed: int = 0, intermediate_size: int = 128
) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_source)
    return build_tiny_model(
        path,
        tokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        seed=seed,
        intermediate_size=intermediate_size,
    )


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


@pytest.fixture(scope="session")
def tiny_adapters(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> dict[str, Path]:
    """Three PEFT adapters of the tiny model (random weights, ranks 4, 8 and 16), for the
    library's and the server's LoRA tests alike."""
    from lora_adapters import make_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {
        name: make_adapter(tiny_model_dir, root / name, seed=seed, rank=rank)
        for name, seed, rank in (("sql", 11, 4), ("chat", 12, 8), ("wide", 13, 16))
    }


@pytest.fixture(scope="session")
def adapter_greedy(
    tiny_model_dir: Path, tiny_adapters: dict[str, Path]
) -> dict[str | None, list[int]]:
    """PEFT's greedy tokens for ADAPTER_PROMPT, per adapter (None: the base)."""
    from lora_adapters import ADAPTER_PROMPT, ADAPTER_TOKENS, merged_model, peft_greedy

    paths: dict[str | None, Path | None] = {None: None, **tiny_adapters}
    return {
        name: peft_greedy(merged_model(tiny_model_dir, path), ADAPTER_PROMPT, ADAPTER_TOKENS)
        for name, path in paths.items()
    }


@pytest.fixture(scope="session")
def wide_model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource) -> Path:
    """The tiny Llama with an MLP of 1536 (the default model's): its down projection's inner
    dimension is past 1024, where oneDNN computes a lone row its own way (the batch invariance
    tests need the matmul shapes where the libraries differ)."""
    return build_tiny_llama(
        tmp_path_factory.mktemp("wide-llama"), tokenizer_source, intermediate_size=1536
    )
