"""One real server with the default chat model and the default embedding model
(`trio-llm serve SmolLM2-135M-Instruct all-MiniLM-L6-v2`): both endpoints answer, /v1/models
lists both, and /v1/embeddings behaves as OpenAI's (floats and base64, every input form,
usage) with vLLM's extensions (truncate_prompt_tokens), through the OpenAI SDK and raw
httpx."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from embedding_corpus import sentences
from http_server_process import ServerProcess, run_server
from trio_llm.config import DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL
from trio_llm.model_files import load_tokenizer, resolve_model

EMBED = DEFAULT_EMBEDDING_MODEL


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with run_server(
        f"{DEFAULT_MODEL}:max-len=1024",
        f"{EMBED}:dtype=float32",
        "--kv-cache-memory", "64MiB",
        "--max-embedding-inputs", "64",
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


def post(server: ServerProcess, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    return httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)


@pytest.mark.slow
def test_one_server_answers_chat_and_embeddings(server: ServerProcess, sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == [DEFAULT_MODEL, EMBED]
    chat = [{"role": "user", "content": "Name a colour."}]
    reply = sdk.chat.completions.create(model=DEFAULT_MODEL, messages=chat, max_tokens=8)  # type: ignore[arg-type]
    assert reply.choices[0].message.content and reply.usage is not None
    texts = ["The cat sits on the mat.", "A feline rests on a rug.", "Stock markets fell."]
    result = sdk.embeddings.create(model=EMBED, input=texts)  # the SDK asks for base64
    vectors = np.array([d.embedding for d in result.data])
    assert vectors.shape == (3, 384) and [d.index for d in result.data] == [0, 1, 2]
    similar, unrelated = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > unrelated + 0.2
    assert result.model == EMBED and result.usage.prompt_tokens == result.usage.total_tokens > 10
    assert "serving SmolLM2-135M-Instruct (" in "".join(server.log)
    assert f"{EMBED} (embeddings of 384, float32" in "".join(server.log)


@pytest.mark.slow
def test_base64_equals_float_and_matches_sentence_transformers(server: ServerProcess) -> None:
    from sentence_transformers import SentenceTransformer

    texts = sentences(12, seed=3)
    floats = post(server, {"model": EMBED, "input": texts}).json()
    b64 = post(server, {"model": EMBED, "input": texts, "encoding_format": "base64"}).json()
    as_floats = np.array([d["embedding"] for d in floats["data"]], dtype=np.float32)
    as_b64 = np.stack(
        [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]]
    )
    assert np.array_equal(as_floats, as_b64)
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    assert floats["id"].startswith("embd-")
    reference = SentenceTransformer(str(resolve_model(EMBED).path), device="cpu").encode(texts)
    assert ((as_floats * reference).sum(1) >= 0.9999).all()


@pytest.mark.slow
def test_token_id_inputs_and_truncation(server: ServerProcess) -> None:
    tokenizer = load_tokenizer(resolve_model(EMBED))
    text = "Token ids give the same embedding as their text."
    ids = tokenizer.encode(text)
    by_text = post(server, {"model": EMBED, "input": text}).json()
    by_ids = post(server, {"model": EMBED, "input": ids}).json()
    by_lists = post(server, {"model": EMBED, "input": [ids, ids[:5]]}).json()
    assert by_text["data"][0]["embedding"] == by_ids["data"][0]["embedding"]
    assert by_lists["data"][0]["embedding"] == by_ids["data"][0]["embedding"]
    assert by_text["usage"]["prompt_tokens"] == len(ids)
    assert by_lists["usage"]["prompt_tokens"] == len(ids) + 5

    long = "word " * 400
    refused = post(server, {"model": EMBED, "input": ["short", long]})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "input[1]" and error["code"] == "context_length_exceeded"
    assert "256" in error["message"]
    cut = post(server, {"model": EMBED, "input": long, "truncate_prompt_tokens": -1}).json()
    assert cut["usage"]["prompt_tokens"] == 256
    ten = post(server, {"model": EMBED, "input": long, "truncate_prompt_tokens": 10}).json()
    assert ten["usage"]["prompt_tokens"] == 10


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": EMBED, "input": "x", "dimensions": 128}, 400, "dimensions"),
        ({"model": EMBED, "input": ["x"] * 65}, 400, "input"),
        ({"model": EMBED, "input": []}, 400, "input"),
        ({"model": EMBED, "input": [""]}, 400, "input"),
        ({"model": EMBED, "input": [1, "x"]}, 400, "input"),
        ({"model": EMBED, "input": [999999]}, 400, "input"),
        ({"model": EMBED, "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": DEFAULT_MODEL, "input": "x"}, 400, "model"),
        ({"model": "gpt-4", "input": "x"}, 404, "model"),
    ],
)
def test_bad_embedding_requests(
    server: ServerProcess,
    body: dict,
    status: int,
    param: str,  # type: ignore[type-arg]
) -> None:
    response = post(server, body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.slow
def test_each_model_refuses_the_others_endpoint_naming_which_serves_which(
    server: ServerProcess,
) -> None:
    wrong = post(server, {"model": DEFAULT_MODEL, "input": "x"}).json()["error"]["message"]
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": EMBED, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 400
    for message in (wrong, chat.json()["error"]["message"]):
        assert f"/v1/embeddings: `{EMBED}`" in message
        assert (
            f"/v1/chat/completions, /v1/completions and /v1/responses: `{DEFAULT_MODEL}`" in message
        )
    dims = post(server, {"model": EMBED, "input": "x", "dimensions": 384})
    assert dims.status_code == 200  # its own size is no cut
    m = server.wait_idle(5.0)
    assert m["trio_llm_embedding_inputs_total"] > 0
    assert server.labelled("trio_llm_replica_alive") == {
        (DEFAULT_MODEL, "0"): 1.0,
        (EMBED, "0"): 1.0,
    }


@pytest.mark.slow
def test_the_default_pair_answers_rerank_out_of_the_box(server: ServerProcess) -> None:
    """`trio-llm serve SmolLM2-135M-Instruct all-MiniLM-L6-v2`: the embedding model ranks
    documents by the cosine of their embeddings with the query's."""
    documents = [
        "The stock market fell sharply on Monday.",
        "Paris is the capital and largest city of France.",
        "A recipe for apple pie with cinnamon.",
    ]
    body = {"query": "What is the capital of France?", "documents": documents, "top_n": 2}
    reply = httpx.post(server.url + "/v1/rerank", json={"model": EMBED, **body}, timeout=60)
    results = reply.json()["results"]
    assert [r["index"] for r in results][:1] == [1] and len(results) == 2
    assert results[0]["relevance_score"] > results[1]["relevance_score"] + 0.2
    assert results[0]["document"] == {"text": documents[1]}
    wrong = httpx.post(server.url + "/rerank", json={"model": DEFAULT_MODEL, **body}, timeout=30)
    assert wrong.status_code == 400
    assert f"/score and /rerank: `{EMBED}`" in wrong.json()["error"]["message"]
