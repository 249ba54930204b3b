"""Embeddings through the library: `LLM.embed` (the synchronous face) and `EngineClient.embed`
on all-MiniLM-L6-v2, with the checks that run before anything reaches the engine."""

from __future__ import annotations

import numpy as np
import pytest

from trio_llm import (
    DEFAULT_EMBEDDING_MODEL,
    LLM,
    InvalidPromptError,
    PromptTooLongError,
    SamplingParams,
    UnsupportedTaskError,
)


@pytest.fixture(scope="module")
def llm() -> LLM:
    with LLM(DEFAULT_EMBEDDING_MODEL, dtype="float32", num_threads=1) as llm:
        yield llm  # type: ignore[misc]


def test_llm_embed_in_order_with_truncation(llm: LLM) -> None:
    texts = ["the first", "a second, longer sentence about something else", "third"]
    outputs = llm.embed(texts)
    assert [len(o.outputs.embedding) for o in outputs] == [384] * 3
    alone = llm.embed(texts[1])
    assert np.allclose(alone[0].outputs.data, outputs[1].outputs.data, atol=1e-6)
    assert llm.model_config.task == "embed" and llm.model_config.normalized
    with pytest.raises(PromptTooLongError, match="input has 402 tokens"):
        llm.embed("word " * 400)
    [cut] = llm.embed("word " * 400, truncate_prompt_tokens=-1)
    assert len(cut.prompt_token_ids) == 256
    with pytest.raises(InvalidPromptError, match="truncate_prompt_tokens"):
        llm.embed("x", truncate_prompt_tokens=300)


def test_an_embedding_model_refuses_generation_and_cuts(llm: LLM) -> None:
    with pytest.raises(UnsupportedTaskError, match="serves embeddings, not generation"):
        llm.generate("hello", SamplingParams(max_tokens=2))
    with pytest.raises(InvalidPromptError, match="not trained to be cut shorter"):
        llm.embed("x", dimensions=10)
    assert len(llm.embed("x", dimensions=384)[0].outputs.embedding) == 384
