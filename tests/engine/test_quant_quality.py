"""The default model's GGUF in its own formats keeps its quality: perplexity on a fixed text
(tests/data/perplexity_text.txt) within 1% of llama.cpp's on the same file and tokens (measured
by bench/weights/quant_quality.py, recorded in tests/data/perplexity_llama_cpp.json), and close to
the same file dequantized to bfloat16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import make_core

from trio_llm.engine.models.gguf_weights import weights_nbytes
from trio_llm.engine.perplexity import perplexity
from trio_llm.engine.quant import Int4Weight, Int8Weight
from trio_llm.engine.step.core import EngineCore
from trio_llm.model_files import ModelSource, default_gguf_path, load_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokens(default_model: ModelSource) -> list[int]:
    text = (DATA / "perplexity_text.txt").read_text()
    return load_tokenizer(default_model)(text)["input_ids"]


@pytest.fixture(scope="module")
def quantized(default_model: ModelSource) -> EngineCore:
    return make_core(default_model.name, dtype="auto", kv_cache_memory="64MiB")


def test_the_default_gguf_runs_in_its_own_formats_in_less_memory_than_its_file(
    quantized: EngineCore,
) -> None:
    own = quantized.runner.own
    assert own is not None and own.quantized
    assert isinstance(own.layers[0].qkv, Int4Weight)  # Q4_1
    assert isinstance(own.lm_head, Int8Weight)  # Q8_0 vocabulary: int8 rows
    assert own.embed is own.lm_head  # tied: one copy
    assert weights_nbytes(own) <= 1.2 * default_gguf_path().stat().st_size


def test_perplexity_is_within_one_percent_of_llama_cpp(
    quantized: EngineCore, tokens: list[int]
) -> None:
    ours = perplexity(quantized, tokens)
    reference = json.loads((DATA / "perplexity_llama_cpp.json").read_text())["ppl"]
    assert abs(ours / reference - 1) <= 0.01, (ours, reference)
