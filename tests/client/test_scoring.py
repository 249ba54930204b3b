"""Scores and classes through the library: `LLM.score` and `LLM.classify` (the synchronous
face of `EngineClient.score`/`classify`) on a tiny BERT cross-encoder, equal to
sentence-transformers' `CrossEncoder`; vLLM's pairing rules; and the checks that run before
anything reaches the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from classifier_models import build_bert_cross_encoder
from trio_llm import LLM, InvalidPromptError, PromptTooLongError, UnsupportedTaskError
from trio_llm.client.scoring import pair_up

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "the cat sat on the mat", "berlin"]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert_cross_encoder(tmp_path_factory.mktemp("ce"))


@pytest.fixture(scope="module")
def llm(cross_encoder: Path) -> Iterator[LLM]:
    with LLM(str(cross_encoder), dtype="float32", num_threads=1) as llm:
        yield llm


def test_pairs_are_one_to_one_one_to_many_or_many_to_many() -> None:
    assert pair_up("q", "d") == (["q"], ["d"])
    assert pair_up("q", ["a", "b"]) == (["q", "q"], ["a", "b"])
    assert pair_up(["q"], ["a", "b"]) == (["q", "q"], ["a", "b"])
    assert pair_up(["q", "r"], ["a", "b"]) == (["q", "r"], ["a", "b"])
    for text_1, text_2, param in [
        (["q", "r"], ["a", "b", "c"], "text_2"),
        ([], ["a"], "text_1"),
        ("q", [], "text_2"),
        ("q", ["a", ""], "text_2[1]"),
        ("", "a", "text_1"),
    ]:
        with pytest.raises(InvalidPromptError) as error:
            pair_up(text_1, text_2)
        assert error.value.param == param
    with pytest.raises(InvalidPromptError) as error:
        pair_up("q", ["a", ""], ("query", "documents"))
    assert error.value.param == "documents[1]"


def test_llm_score_equals_the_cross_encoder(llm: LLM, cross_encoder: Path) -> None:
    from sentence_transformers import CrossEncoder

    assert (llm.model_config.task, llm.model_config.labels) == ("score", ["LABEL_0"])
    outputs = llm.score(QUERY, DOCUMENTS)
    expected = CrossEncoder(str(cross_encoder), device="cpu").predict(
        [(QUERY, d) for d in DOCUMENTS]
    )
    np.testing.assert_allclose([o.outputs.score for o in outputs], expected, rtol=2e-6)
    assert [len(o.prompt_token_ids) for o in outputs] == [15, 15, 10]
    pairwise = llm.score(DOCUMENTS, DOCUMENTS[::-1])
    expected = CrossEncoder(str(cross_encoder), device="cpu").predict(
        list(zip(DOCUMENTS, DOCUMENTS[::-1]))
    )
    np.testing.assert_allclose([o.outputs.score for o in pairwise], expected, rtol=2e-6)
    [one] = llm.classify(QUERY)
    assert one.outputs.label == "LABEL_0" and one.outputs.num_classes == 1
    assert 0 < one.outputs.probs[0] < 1  # a cross-encoder's one label: its sigmoid


def test_what_the_client_refuses_before_sending(llm: LLM) -> None:
    with pytest.raises(UnsupportedTaskError, match=r"cross-encoder.*not embeddings"):
        llm.embed("x")
    with pytest.raises(PromptTooLongError) as too_long:
        llm.score(QUERY, ["a", "word " * 200])
    assert too_long.value.param == "text_2[1]"
    [cut] = llm.score(QUERY, "word " * 200, truncate_prompt_tokens=-1)
    assert len(cut.prompt_token_ids) == 128
    with pytest.raises(InvalidPromptError) as past:
        llm.score(QUERY, "a", truncate_prompt_tokens=129)
    assert past.value.param == "truncate_prompt_tokens"


async def test_a_router_scores_by_cosine_or_cross_encoder_and_classifies(
    cross_encoder: Path,
) -> None:
    """Through `Router` (its leases, as the HTTP server uses them): an embedding model scores
    by the cosine of its embeddings, a cross-encoder by its pair; only the latter classifies."""
    from trio_llm import DEFAULT_EMBEDDING_MODEL, open_router

    options = {"dtype": "float32", "num_threads": 1}
    async with open_router(DEFAULT_EMBEDDING_MODEL, str(cross_encoder), **options) as router:
        texts = ["a red apple", "stock markets fell"]
        same, other = await router.score("a red apple", texts, model=DEFAULT_EMBEDDING_MODEL)
        assert abs(same.outputs.score - 1.0) < 1e-5 and other.outputs.score < 0.5
        vectors = [o.outputs.data for o in await router.embed_batch(texts)]
        assert abs(other.outputs.score - float(vectors[0] @ vectors[1])) < 1e-5
        assert len(other.prompt_token_ids) == 5 + 5  # both texts, as vLLM counts them
        with pytest.raises(UnsupportedTaskError, match="serves embeddings, not classification"):
            await router.classify(["x"], model=DEFAULT_EMBEDDING_MODEL)
        [pair] = await router.score(QUERY, DOCUMENTS[0], model=cross_encoder.name)
        [alone] = await router.classify([QUERY], model=cross_encoder.name)
        assert pair.outputs.score != alone.outputs.probs[0]  # the pair, not the query alone
        assert all(r.load == 0 for _, r in router.replicas())
