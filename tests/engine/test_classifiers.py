"""Cross-encoders and classifiers on the pooling engine: the task chosen from the checkpoint,
and scores equal (within float32 rounding) to transformers' own forward and to
sentence-transformers' `CrossEncoder.predict`, for pairs packed into one step and each alone:
a BERT cross-encoder (token types), an XLM-R one (no token types, positions past the padding
index) and a Qwen2 classifier with three labels (last-token pooling, softmax)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from classifier_models import (
    QWEN2_LABELS,
    build_bert_cross_encoder,
    build_qwen2_classifier,
    build_xlmr_cross_encoder,
)
from embedding_corpus import sentences
from trio_llm.config import DEFAULT_EMBEDDING_MODEL, EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.model_files import ModelSource, UnsupportedModelError, load_tokenizer
from trio_llm.sampling_params import SamplingParams

QUERIES = ["what is the capital of france", "a cat sat on the mat"]
DOCUMENTS = sentences(24, seed=29)
PAIRS = [(QUERIES[i % 2], d) for i, d in enumerate(DOCUMENTS)]


def run_pooled(core: EngineCore, inputs: list[tuple[list[int], int]], *, alone: bool) -> np.ndarray:
    """Each input's output row: all added before the first step, or each run on its own."""
    results: dict[str, bytes] = {}

    def run() -> None:
        while core.has_work():
            for out in core.step().outputs:
                assert out.error is None, out.error
                assert out.pooled is not None
                results[out.request_id] = out.pooled

    for i, (ids, start) in enumerate(inputs):
        core.add_request(
            EngineCoreRequest(
                request_id=str(i), prompt_token_ids=ids, sampling_params=SamplingParams(),
                pooling=True, token_type_start=start,
            )
        )  # fmt: skip
        if alone:
            run()
    run()
    return np.stack([np.frombuffer(results[str(i)], np.float32) for i in range(len(inputs))])


def pair_inputs(path: Path, max_len: int) -> list[tuple[list[int], int]]:
    """The pairs as the client encodes them (the tokenizer's pair encoding, longest first
    truncation), with where the second text starts."""
    tokenizer = load_tokenizer(ModelSource(path.name, path, str(path)))
    encoded = tokenizer(
        [q for q, _ in PAIRS], [d for _, d in PAIRS], truncation=True, max_length=max_len
    )
    types = encoded.get("token_type_ids")
    return [
        (list(ids), list(types[i]).index(1) if types is not None else 0)
        for i, ids in enumerate(encoded["input_ids"])
    ]


def transformers_scores(path: Path, max_len: int) -> np.ndarray:
    """transformers' forward, one pair at a time (no padding), with sigmoid."""
    from transformers import AutoModelForSequenceClassification

    tokenizer = load_tokenizer(ModelSource(path.name, path, str(path)))
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.inference_mode():
        for q, d in PAIRS:
            enc = tokenizer(q, d, truncation=True, max_length=max_len, return_tensors="pt")
            out.append(torch.sigmoid(model(**enc).logits)[0].numpy())
    return np.stack(out)


@pytest.fixture(scope="module")
def bert_ce(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert_cross_encoder(tmp_path_factory.mktemp("bert-ce"))


@pytest.fixture(scope="module")
def xlmr_ce(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_xlmr_cross_encoder(tmp_path_factory.mktemp("xlmr-ce"))


@pytest.fixture(scope="module")
def qwen2_classifier(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource
) -> Path:
    return build_qwen2_classifier(tmp_path_factory.mktemp("qwen2-cls"), tokenizer_source)


@pytest.mark.parametrize("which", ["bert", "xlmr"])
@pytest.mark.parametrize("alone", [False, True], ids=["batched", "alone"])
def test_cross_encoder_scores_equal_transformers_and_sentence_transformers(
    request: pytest.FixtureRequest, which: str, alone: bool
) -> None:
    from sentence_transformers import CrossEncoder

    path: Path = request.getfixturevalue(f"{which}_ce")
    core = EngineCore(EngineArgs(model=str(path), dtype="float32", num_threads=1))
    assert (core.ready.task, core.ready.labels, core.max_model_len) == ("score", ["LABEL_0"], 128)
    assert core.ready.kv_cache_bytes == 0
    inputs = pair_inputs(path, core.max_model_len)
    assert max(len(ids) for ids, _ in inputs) == 128 and min(len(ids) for ids, _ in inputs) < 20
    scores = run_pooled(core, inputs, alone=alone)[:, 0]
    reference = transformers_scores(path, core.max_model_len)[:, 0]
    np.testing.assert_allclose(scores, reference, rtol=2e-6, atol=2e-7)
    predicted = CrossEncoder(str(path), device="cpu", max_length=128).predict(PAIRS)
    np.testing.assert_allclose(scores, predicted, rtol=2e-6, atol=2e-7)
    if not alone:
        assert core.stats().num_steps == 1  # all pairs in one packed step


def test_a_bert_pair_gets_its_token_types(bert_ce: Path) -> None:
    """Without the second text's token type the score is another (so the engine's equality
    with transformers above is not by chance)."""
    core = EngineCore(EngineArgs(model=str(bert_ce), dtype="float32", num_threads=1))
    inputs = pair_inputs(bert_ce, core.max_model_len)[:4]
    assert all(start > 0 for _, start in inputs)
    typed = run_pooled(core, inputs, alone=False)
    untyped = run_pooled(core, [(ids, 0) for ids, _ in inputs], alone=False)
    assert np.abs(typed - untyped).min() > 1e-4


def test_the_config_activation_is_applied(tmp_path: Path) -> None:
    """A cross-encoder whose sentence-transformers config says Identity scores by its raw
    logit, as `CrossEncoder.predict` does."""
    from sentence_transformers import CrossEncoder

    path = build_bert_cross_encoder(tmp_path, activation="torch.nn.modules.linear.Identity")
    core = EngineCore(EngineArgs(model=str(path), dtype="float32", num_threads=1))
    scores = run_pooled(core, pair_inputs(path, 128), alone=False)[:, 0]
    predicted = CrossEncoder(str(path), device="cpu", max_length=128).predict(PAIRS)
    np.testing.assert_allclose(scores, predicted, rtol=2e-6, atol=2e-6)
    assert scores.min() < 0 or scores.max() > 1  # raw logits, not probabilities


def test_a_qwen2_classifier_equals_transformers(qwen2_classifier: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    core = EngineCore(EngineArgs(model=str(qwen2_classifier), dtype="float32", num_threads=1))
    assert core.ready.task == "classify"
    assert core.ready.labels == list(QWEN2_LABELS.values())
    tokenizer = load_tokenizer(ModelSource("q", qwen2_classifier, ""))
    texts = sentences(12, seed=4)
    inputs = [(tokenizer.encode(t)[:256], 0) for t in texts]
    batched = run_pooled(core, inputs, alone=False)
    alone = run_pooled(core, inputs, alone=True)
    model = AutoModelForSequenceClassification.from_pretrained(qwen2_classifier).eval()
    with torch.inference_mode():
        reference = np.stack(
            [torch.softmax(model(torch.tensor([ids])).logits, -1)[0].numpy() for ids, _ in inputs]
        )
    np.testing.assert_allclose(batched, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(alone, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(batched.sum(1), 1.0, rtol=1e-6)


def test_the_task_comes_from_the_checkpoint_or_is_refused(
    tmp_path: Path, bert_ce: Path, tiny_model_dir: Path
) -> None:
    three = build_bert_cross_encoder(tmp_path / "three", num_labels=3)
    assert EngineCore(EngineArgs(model=str(three), num_threads=1)).ready.task == "classify"
    with pytest.raises(UnsupportedModelError, match=r"has 3 labels.*task classify"):
        EngineCore(EngineArgs(model=str(three), task="score", num_threads=1))
    with pytest.raises(UnsupportedModelError, match="does not generate"):
        EngineCore(EngineArgs(model=str(bert_ce), task="generate", num_threads=1))
    with pytest.raises(UnsupportedModelError, match="scores by cosine with task embed"):
        EngineCore(EngineArgs(model=DEFAULT_EMBEDDING_MODEL, task="score", num_threads=1))
    with pytest.raises(UnsupportedModelError, match="no sequence-classification head"):
        EngineCore(EngineArgs(model=str(tiny_model_dir), task="classify", num_threads=1))
    # A cross-encoder's base model still embeds, when asked to.
    embedder = EngineCore(EngineArgs(model=str(bert_ce), task="embed", num_threads=1))
    assert (embedder.ready.task, embedder.ready.embedding_size) == ("embed", 64)
