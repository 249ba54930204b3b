"""The pooling endpoints on one real server with five models: tiny random-weight BERT and XLM-R
cross-encoders, a Qwen2 classifier of three labels, all-MiniLM-L6-v2 (scores by cosine) and
a tiny generative Llama. /rerank (/v1, /v2) in vLLM's, Jina's and Cohere's shapes, through
raw httpx and the `cohere` SDK's v2 rerank; /score, /classify, /pooling, /invocations; the
scores equal sentence-transformers' own; every bad input a 400 naming its field, and a model
that cannot serve the endpoint a 400 naming the models that can."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import numpy as np
import pytest
import trio

from classifier_models import (
    QWEN2_LABELS,
    build_bert_cross_encoder,
    build_qwen2_classifier,
    build_xlmr_cross_encoder,
)
from embedding_corpus import sentences
from http_server_process import ServerProcess, run_server
from trio_llm.config import DEFAULT_EMBEDDING_MODEL
from trio_llm.http.pooling.plan import pooling_options
from trio_llm.http.pooling.protocol import PoolingRequest
from trio_llm.model_files import ModelSource, load_tokenizer, resolve_model

EMBED = DEFAULT_EMBEDDING_MODEL
QUERY = "what is the capital of france"
DOCUMENTS = [
    "paris is the capital of france",
    "the cat sat on the mat",
    "berlin is the capital of germany",
    *[s for s in sentences(40, seed=11) if len(s.split()) < 60][:9],
]
"""Each fits the cross-encoders' 128 tokens with the query (a longer one is a 400 without
truncate_prompt_tokens)."""


@pytest.fixture(scope="module")
def models(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pooling-models")
    return {
        "bert-ce": build_bert_cross_encoder(root / "bert"),
        "xlmr-ce": build_xlmr_cross_encoder(root / "xlmr"),
        "qwen-cls": build_qwen2_classifier(root / "qwen", tokenizer_source),
    }


@pytest.fixture(scope="module")
def server(models: dict[str, Path], tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with run_server(
        *(f"{path}:name={name},dtype=float32" for name, path in models.items()),
        f"{EMBED}:dtype=float32",
        f"{tiny_model_dir}:name=tiny,dtype=float32",
        "--kv-cache-memory", "32MiB",
        "--max-embedding-inputs", "64",
    ) as s:  # fmt: skip
        yield s


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    return httpx.post(server.url + path, json=body, timeout=60)


def cross_encoder(path: Path) -> object:
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), device="cpu", max_length=128)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_ranks_by_the_cross_encoders_own_scores(
    server: ServerProcess, models: dict[str, Path], route: str
) -> None:
    body = {"model": "bert-ce", "query": QUERY, "documents": DOCUMENTS}
    reply = post(server, route, body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["id"].startswith("rerank-") and answer["model"] == "bert-ce"
    expected = cross_encoder(models["bert-ce"]).predict([(QUERY, d) for d in DOCUMENTS])  # type: ignore[attr-defined]
    results = answer["results"]
    assert [r["index"] for r in results] == list(np.argsort(-expected, kind="stable"))
    got = np.array([r["relevance_score"] for r in results])
    np.testing.assert_allclose(got, np.sort(expected)[::-1], rtol=2e-6, atol=2e-7)
    assert all(r["document"] == {"text": DOCUMENTS[r["index"]]} for r in results)
    tokenizer = load_tokenizer(ModelSource("b", models["bert-ce"], ""))
    tokens = sum(len(tokenizer(QUERY, d)["input_ids"]) for d in DOCUMENTS)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # Cohere's routes carry Cohere's meta (a search unit per 100 documents); vLLM's none.
    version = {"/v1/rerank": "1", "/v2/rerank": "2"}.get(route)
    meta = {"api_version": {"version": version}, "billed_units": {"search_units": 1}}
    assert answer.get("meta") == (meta if version else None)


@pytest.mark.slow
def test_rerank_options_top_n_objects_and_no_documents(server: ServerProcess) -> None:
    full = post(server, "/rerank", {"model": "xlmr-ce", "query": QUERY, "documents": DOCUMENTS})
    ranked = full.json()["results"]
    top = post(
        server,
        "/v1/rerank",
        {
            "model": "xlmr-ce",
            "query": QUERY,
            "documents": [{"text": d, "id": i} for i, d in enumerate(DOCUMENTS)],
            "top_n": 3,
            "return_documents": False,
        },
    ).json()["results"]
    # The same ranking and scores; a score may move in its last float32 bit with what else
    # shares the engine's step (pooling engines are not batch invariant).
    assert [r["index"] for r in top] == [r["index"] for r in ranked[:3]]
    assert all(set(r) == {"index", "relevance_score"} for r in top)
    for got, want in zip(top, ranked[:3], strict=True):
        assert got["relevance_score"] == pytest.approx(want["relevance_score"], rel=1e-5)
    two = {"model": "xlmr-ce", "query": QUERY, "documents": DOCUMENTS[:2], "top_n": 5}
    many = post(server, "/rerank", two)
    assert len(many.json()["results"]) == 2  # more than there are: all of them


@pytest.mark.slow
def test_the_cohere_sdk_reranks_against_the_server(
    server: ServerProcess, models: dict[str, Path]
) -> None:
    import cohere

    client = cohere.ClientV2(api_key="none", base_url=server.url)
    reply = client.rerank(model="bert-ce", query=QUERY, documents=DOCUMENTS, top_n=4)
    expected = cross_encoder(models["bert-ce"]).predict([(QUERY, d) for d in DOCUMENTS])  # type: ignore[attr-defined]
    assert [r.index for r in reply.results] == list(np.argsort(-expected, kind="stable")[:4])
    for result in reply.results:
        assert abs(result.relevance_score - expected[result.index]) < 1e-6
    assert reply.meta is not None and reply.meta.api_version is not None
    assert reply.meta.api_version.version == "2"
    assert reply.meta.billed_units is not None and reply.meta.billed_units.search_units == 1


@pytest.mark.slow
def test_score_pairs_one_to_many_and_many_to_many(
    server: ServerProcess, models: dict[str, Path]
) -> None:
    docs = DOCUMENTS[:4]
    one_to_many = post(server, "/score", {"model": "xlmr-ce", "text_1": QUERY, "text_2": docs})
    answer = one_to_many.json()
    assert answer["object"] == "list" and answer["id"].startswith("score-")
    assert [d["index"] for d in answer["data"]] == [0, 1, 2, 3]
    assert {d["object"] for d in answer["data"]} == {"score"}
    expected = cross_encoder(models["xlmr-ce"]).predict([(QUERY, d) for d in docs])  # type: ignore[attr-defined]
    got = [d["score"] for d in answer["data"]]
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-7)
    pairs = post(server, "/v1/score", {"model": "xlmr-ce", "text_1": docs, "text_2": docs[::-1]})
    expected = cross_encoder(models["xlmr-ce"]).predict(list(zip(docs, docs[::-1])))  # type: ignore[attr-defined]
    np.testing.assert_allclose([d["score"] for d in pairs.json()["data"]], expected, rtol=2e-6)
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 4


@pytest.mark.slow
def test_an_embedding_model_scores_and_reranks_by_cosine(server: ServerProcess) -> None:
    from sentence_transformers import SentenceTransformer

    vectors = SentenceTransformer(str(resolve_model(EMBED).path), device="cpu").encode(
        [QUERY, *DOCUMENTS]
    )
    cosines = (
        vectors[1:]
        @ vectors[0]
        / (np.linalg.norm(vectors[1:], axis=1) * np.linalg.norm(vectors[0]))
    )
    scores = post(server, "/score", {"model": EMBED, "text_1": QUERY, "text_2": DOCUMENTS})
    np.testing.assert_allclose([d["score"] for d in scores.json()["data"]], cosines, atol=1e-5)
    ranked = post(server, "/rerank", {"model": EMBED, "query": QUERY, "documents": DOCUMENTS})
    assert ranked.json()["results"][0]["index"] == 0  # paris, the capital of france


@pytest.mark.slow
def test_classify_and_pooling_on_a_qwen2_classifier(
    server: ServerProcess, models: dict[str, Path]
) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification

    texts = ["I like this", "the weather is grey", sentences(1, seed=3)[0]]
    answer = post(server, "/classify", {"model": "qwen-cls", "input": texts}).json()
    assert answer["id"].startswith("classify-") and answer["object"] == "list"
    tokenizer = load_tokenizer(ModelSource("q", models["qwen-cls"], ""))
    model = AutoModelForSequenceClassification.from_pretrained(models["qwen-cls"]).eval()
    for item, text in zip(answer["data"], texts, strict=True):
        with torch.inference_mode():
            probs = torch.softmax(model(**tokenizer(text, return_tensors="pt")).logits, -1)[0]
        np.testing.assert_allclose(item["probs"], probs.numpy(), rtol=1e-5, atol=1e-6)
        assert item["label"] == QWEN2_LABELS[int(probs.argmax())]
        assert (item["num_classes"], item["object"]) == (3, "classify")
    tokens = sum(len(tokenizer(t)["input_ids"]) for t in texts)
    assert answer["usage"]["prompt_tokens"] == tokens
    pooled = post(server, "/pooling", {"model": "qwen-cls", "input": texts}).json()
    assert pooled["id"].startswith("pool-") and pooled["data"][0]["object"] == "pooling"
    np.testing.assert_allclose(
        [d["data"] for d in pooled["data"]], [d["probs"] for d in answer["data"]], rtol=1e-5
    )


@pytest.mark.slow
def test_pooling_gives_an_embedding_models_embeddings_and_renders_messages(
    server: ServerProcess,
) -> None:
    texts = ["one text", "another"]
    embedded = post(server, "/v1/embeddings", {"model": EMBED, "input": texts}).json()
    pooled = post(server, "/pooling", {"model": EMBED, "input": texts}).json()
    np.testing.assert_allclose(
        [d["data"] for d in pooled["data"]], [d["embedding"] for d in embedded["data"]], atol=1e-6
    )
    assert pooled["usage"]["prompt_tokens"] == embedded["usage"]["prompt_tokens"]
    chat = {"model": "qwen-cls", "messages": [{"role": "user", "content": "hi"}]}
    rendered = post(server, "/pooling", chat)
    assert rendered.status_code == 200 and len(rendered.json()["data"][0]["data"]) == 3
    no_template = post(server, "/pooling", {**chat, "model": EMBED})
    assert no_template.status_code == 400
    assert no_template.json()["error"]["param"] == "messages"
    # vLLM's task, normalize and use_activation: the model's own task and what its engine
    # gives are served; what would change the output and cannot be done is refused.
    same = {"model": EMBED, "input": texts, "task": "embed", "normalize": True}
    np.testing.assert_allclose(
        [d["data"] for d in post(server, "/pooling", same).json()["data"]],
        [d["data"] for d in pooled["data"]],
    )
    for field, value in (("normalize", False), ("use_activation", True), ("task", "classify")):
        refused = post(server, "/pooling", {"model": EMBED, "input": "x", field: value})
        assert (refused.status_code, refused.json()["error"]["param"]) == (400, field)


@pytest.mark.slow
def test_invocations_dispatches_to_the_pooling_endpoints(server: ServerProcess) -> None:
    score = post(server, "/invocations", {"model": "bert-ce", "text_1": "a", "text_2": ["b"]})
    assert score.json()["data"][0]["object"] == "score"
    rerank = post(server, "/invocations", {"model": "bert-ce", "query": "a", "documents": ["b"]})
    assert rerank.json()["results"][0]["index"] == 0
    classify = post(server, "/invocations", {"model": "qwen-cls", "input": "hi"})
    assert classify.json()["data"][0]["object"] == "classify"
    embed = post(server, "/invocations", {"model": EMBED, "input": "hi"})
    assert embed.json()["data"][0]["object"] == "embedding"


@pytest.mark.slow
def test_a_model_that_cannot_serve_the_endpoint_names_those_that_can(
    server: ServerProcess,
) -> None:
    rerank = post(server, "/rerank", {"model": "tiny", "query": "q", "documents": ["d"]})
    assert rerank.status_code == 400
    error = rerank.json()["error"]
    assert (error["param"], error["code"]) == ("model", "wrong_model_task")
    assert f"/score and /rerank: `bert-ce`, `xlmr-ce`, `{EMBED}`" in error["message"]
    classify = post(server, "/classify", {"model": EMBED, "input": "x"}).json()["error"]
    assert "not classification" in classify["message"]
    assert "/classify: `bert-ce`, `xlmr-ce`, `qwen-cls`" in classify["message"]
    score = post(server, "/score", {"model": "qwen-cls", "text_1": "a", "text_2": "b"})
    assert score.status_code == 400 and "/score and /rerank: `bert-ce`" in score.text
    embeddings = post(server, "/v1/embeddings", {"model": "bert-ce", "input": "x"})
    assert embeddings.status_code == 400 and f"/v1/embeddings: `{EMBED}`" in embeddings.text


def test_pooling_options_normalise_where_the_engine_does_not() -> None:
    request = msgspec.convert({"input": "x", "normalize": True}, PoolingRequest)
    assert pooling_options(request, "embed", normalized=False) is True
    assert pooling_options(request, "embed", normalized=True) is False
    keep = msgspec.convert(
        {"input": "x", "use_activation": True, "task": "classify"}, PoolingRequest
    )
    assert pooling_options(keep, "score", normalized=False) is False


LONG = "word " * 600


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents[1]"),
        ("/rerank", {"query": "", "documents": ["a"]}, "query"),
        ("/rerank", {"query": QUERY, "documents": ["a"], "top_n": -1}, "top_n"),
        ("/rerank", {"query": QUERY, "documents": ["a", LONG]}, "documents[1]"),
        (
            "/rerank",
            {"query": QUERY, "documents": ["a"], "truncate_prompt_tokens": 999},
            "truncate_prompt_tokens",
        ),
        ("/rerank", {"query": QUERY, "documents": [{"txt": "a"}]}, "documents[0]"),
        ("/rerank", {"query": QUERY, "documents": ["a"] * 65}, "documents"),
        ("/score", {"text_1": [], "text_2": "b"}, "text_1"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
        ("/score", {"text_1": "a", "text_2": ["b", ""]}, "text_2[1]"),
        ("/score", {"text_1": "a", "text_2": [LONG]}, "text_2[0]"),
        ("/score", {"text_1": "a", "text_2": 7}, "text_2"),
        ("/classify", {"input": []}, "input"),
        ("/classify", {"input": ["a", LONG]}, "input[1]"),
        ("/pooling", {"input": "a", "messages": [{"role": "user", "content": "a"}]}, "input"),
        ("/pooling", {}, "input"),
        ("/pooling", {"input": "a", "dimensions": 2}, "dimensions"),
        ("/pooling", {"input": "a", "task": "token_classify"}, "task"),
        ("/pooling", {"input": "a", "use_activation": False}, "use_activation"),
        ("/pooling", {"input": "a", "normalize": True}, "normalize"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: ServerProcess,
    path: str,
    body: dict,  # type: ignore[type-arg]
    param: str,
) -> None:
    model = "qwen-cls" if path in ("/classify", "/pooling") else "bert-ce"
    reply = post(server, path, {"model": model, **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.mark.slow
def test_truncation_and_cohere_max_tokens_per_doc(server: ServerProcess) -> None:
    def rerank(documents: list[str], **options: int) -> dict:  # type: ignore[type-arg]
        body = {"model": "bert-ce", "query": QUERY, "documents": documents, **options}
        return post(server, "/rerank", body).json()

    cut = rerank(["a", LONG], truncate_prompt_tokens=-1)
    assert cut["usage"]["prompt_tokens"] == 128 + 10  # the long pair cut to the model's 128
    short, same = rerank([LONG], max_tokens_per_doc=5), rerank(["word " * 5])
    assert (
        abs(short["results"][0]["relevance_score"] - same["results"][0]["relevance_score"]) < 1e-6
    )
    assert short["usage"] == same["usage"]


@pytest.mark.slow
async def test_concurrent_requests_get_what_each_gets_alone(server: ServerProcess) -> None:
    """The engine packs every request's pairs into its steps: batched with others, a
    request's scores are its own."""
    bodies = [
        {
            "model": "bert-ce",
            "query": q,
            "documents": DOCUMENTS[i : i + 5],
            "truncate_prompt_tokens": -1,
        }
        for i, q in enumerate(sentences(8, seed=5))
    ]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        alone = [(await client.post("/rerank", json=b)).json() for b in bodies]
        together: list[dict] = [{}] * len(bodies)  # type: ignore[type-arg]

        async def one(i: int) -> None:
            together[i] = (await client.post("/rerank", json=bodies[i])).json()

        async with trio.open_nursery() as nursery:
            for i in range(len(bodies)):
                nursery.start_soon(one, i)
    for a, t in zip(alone, together, strict=True):
        assert len(a["results"]) == 5
        assert [r["index"] for r in a["results"]] == [r["index"] for r in t["results"]]
        np.testing.assert_allclose(
            [r["relevance_score"] for r in a["results"]],
            [r["relevance_score"] for r in t["results"]],
            rtol=2e-6,
        )
