"""The pooling engine: all-MiniLM-L6-v2 embeddings equal sentence-transformers' own (fp32), for
inputs packed into one batch and each alone; the pooling configuration read from a model's
sentence-transformers files; a decoder served for embeddings; and a pooling engine refusing
what it does not serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embedding_corpus import sentences
from trio_llm.config import DEFAULT_EMBEDDING_MODEL, EngineArgs
from trio_llm.engine.models.pooling import PoolingConfig, PoolingConfigError, pool, pooling_config
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreOutput, EngineCoreRequest
from trio_llm.model_files import load_tokenizer, resolve_model
from trio_llm.sampling_params import SamplingParams

CORPUS = sentences(100, seed=18)


def embed_all(core: EngineCore, inputs: list[list[int]], *, alone: bool) -> np.ndarray:
    """Each input's embedding: all added before the first step, or each run on its own."""
    results: dict[str, EngineCoreOutput] = {}

    def run() -> None:
        while core.has_work():
            for out in core.step().outputs:
                results[out.request_id] = out

    for i, ids in enumerate(inputs):
        core.add_request(
            EngineCoreRequest(
                request_id=str(i), prompt_token_ids=ids, sampling_params=SamplingParams(),
                pooling=True,
            )
        )  # fmt: skip
        if alone:
            run()
    run()
    assert all(results[str(i)].error is None for i in range(len(inputs)))
    return np.stack([np.frombuffer(results[str(i)].pooled, np.float32) for i in range(len(inputs))])


@pytest.fixture(scope="module")
def minilm() -> EngineCore:
    return EngineCore(EngineArgs(model=DEFAULT_EMBEDDING_MODEL, dtype="float32"))


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    source = resolve_model(DEFAULT_EMBEDDING_MODEL)
    model = SentenceTransformer(str(source.path), device="cpu")
    return model.encode(CORPUS, batch_size=32, convert_to_numpy=True)


@pytest.fixture(scope="module")
def corpus_ids(minilm: EngineCore) -> list[list[int]]:
    tokenizer = load_tokenizer(resolve_model(DEFAULT_EMBEDDING_MODEL))
    return [tokenizer.encode(s, truncation=True, max_length=minilm.max_model_len) for s in CORPUS]


def test_minilm_is_served_for_embeddings_as_its_config_says(minilm: EngineCore) -> None:
    ready = minilm.ready
    assert (ready.task, ready.embedding_size, ready.max_model_len) == ("embed", 384, 256)
    assert ready.kv_cache_bytes == 0  # no KV cache at all
    assert minilm.runner.config == PoolingConfig("mean", normalize=True, max_seq_length=256)


@pytest.mark.parametrize("alone", [False, True], ids=["batched", "alone"])
def test_embeddings_equal_sentence_transformers(
    minilm: EngineCore, corpus_ids: list[list[int]], reference: np.ndarray, alone: bool
) -> None:
    lengths = [len(ids) for ids in corpus_ids]
    assert min(lengths) < 10 and max(lengths) == 256  # mixed, some truncated
    embeddings = embed_all(minilm, corpus_ids, alone=alone)
    cosine = (embeddings * reference).sum(1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(reference, axis=1)
    )
    assert cosine.min() >= 0.9999
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    stats = minilm.stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.num_free_blocks == stats.num_total_blocks
    if not alone:
        assert stats.num_steps < len(corpus_ids) * 2  # packed: many inputs per step


def test_a_pooling_engine_refuses_generation_and_overlong_inputs(minilm: EngineCore) -> None:
    minilm.add_request(
        EngineCoreRequest(
            request_id="g", prompt_token_ids=[101, 102], sampling_params=SamplingParams()
        )
    )
    minilm.add_request(
        EngineCoreRequest(
            request_id="long", prompt_token_ids=[100] * 257, sampling_params=SamplingParams(),
            pooling=True,
        )
    )  # fmt: skip
    errors = {out.request_id: out.error for out in minilm.step().outputs}
    assert "serves embeddings, not generation" in (errors["g"] or "")
    assert "at most 256" in (errors["long"] or "")


def test_a_decoder_serves_embeddings_by_its_last_token(tiny_model_dir: Path) -> None:
    core = EngineCore(EngineArgs(model=str(tiny_model_dir), task="embed", dtype="float32"))
    assert core.ready.task == "embed" and core.ready.embedding_size == 64
    assert core.runner.config.mode == "last" and core.runner.config.normalize
    inputs = [[1, 2, 3, 4, 5], [7, 8], [1, 2, 3]]
    batched = embed_all(core, inputs, alone=False)
    alone = embed_all(core, inputs, alone=True)
    assert np.allclose(batched, alone, atol=1e-5)
    # Against transformers' own (causal) attention on the same weights.
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    with torch.inference_mode():
        for embedding, ids in zip(alone, inputs):
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
            expected = torch.nn.functional.normalize(hidden, dim=0).numpy()
            assert np.allclose(embedding, expected, atol=1e-5)


def write_st(path: Path, modules: list[str], pooling: dict[str, bool] | None) -> Path:
    types = {
        "pool": "sentence_transformers.models.Pooling",
        "norm": "sentence_transformers.models.Normalize",
    }
    entries = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]
    entries += [
        {"idx": i + 1, "name": str(i + 1), "path": f"{i + 1}_{m}", "type": types[m]}
        for i, m in enumerate(modules)
    ]
    (path / "modules.json").write_text(json.dumps(entries))
    if pooling is not None:
        (path / "1_pool").mkdir()
        (path / "1_pool" / "config.json").write_text(json.dumps(pooling))
    return path


@pytest.mark.parametrize(
    ("flags", "mode"),
    [
        ({"pooling_mode_cls_token": True}, "cls"),
        ({"pooling_mode_mean_tokens": True}, "mean"),
        ({"pooling_mode_lasttoken": True}, "last"),
    ],
)
def test_pooling_config_from_sentence_transformers_files(
    tmp_path: Path, flags: dict[str, bool], mode: str
) -> None:
    write_st(tmp_path, ["pool"], flags)
    assert pooling_config(tmp_path, is_encoder=True) == PoolingConfig(mode, normalize=False)  # type: ignore[arg-type]


def test_pooling_config_defaults_and_refusals(tmp_path: Path) -> None:
    assert pooling_config(tmp_path, is_encoder=True) == PoolingConfig("cls", normalize=True)
    assert pooling_config(tmp_path, is_encoder=False) == PoolingConfig("last", normalize=True)
    write_st(tmp_path, ["pool", "norm"], {"pooling_mode_max_tokens": True})
    with pytest.raises(PoolingConfigError, match="max_tokens"):
        pooling_config(tmp_path, is_encoder=True)


def test_pool_over_a_packed_row() -> None:
    hidden = torch.arange(12, dtype=torch.float32).view(6, 2)
    cu = torch.tensor([0, 1, 4, 6])
    mean = pool(hidden, cu, PoolingConfig("mean", normalize=False))
    assert mean.tolist() == [[0, 1], [4, 5], [9, 10]]
    assert pool(hidden, cu, PoolingConfig("cls", normalize=False)).tolist() == [
        [0, 1],
        [2, 3],
        [8, 9],
    ]
    assert pool(hidden, cu, PoolingConfig("last", normalize=False)).tolist() == [
        [0, 1],
        [6, 7],
        [10, 11],
    ]
