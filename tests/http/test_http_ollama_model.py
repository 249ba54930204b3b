"""Ollama's API through the real server on the default model, driven by Ollama's own Python
client as a user would: chat and generate streamed and not (the same answer for the same
seed), num_predict, stop, a format schema, a tool call's history answered, generate's raw
prompt and context, the models as /api/tags, /api/show and /api/ps describe them, a client
that hangs up freeing its sequence; and /api/embed on the default embedding model. Generation
runs on the session's shared server (conftest.py's `default_server`)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import jsonschema
import numpy as np
import ollama
import pytest

from http_server_process import ServerProcess, run_server
from trio_llm.config import DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a story."}]
SAMPLED = {"temperature": 1.0, "seed": 7}


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> Iterator[ollama.Client]:
    """Closed at the end: a kept-alive connection would hold the server's shutdown."""
    with ollama.Client(host=default_server.url, timeout=120) as client:
        yield client


def test_chat_streamed_and_not_give_the_same_answer_for_a_seed(client: ollama.Client) -> None:
    options = {**SAMPLED, "num_predict": 24}
    # Once cached, the prompt's prefix is read back the same way by both requests (a cold
    # prefill's numerics may differ from a warm one's, enough to tip a sampled token).
    client.chat(DEFAULT_MODEL, STORY, options={"num_predict": 1})
    whole = client.chat(DEFAULT_MODEL, STORY, options=options)
    parts = list(client.chat(DEFAULT_MODEL, STORY, options=options, stream=True))
    assert whole.message.content.strip()
    assert "".join(p.message.content for p in parts) == whole.message.content
    last = parts[-1]
    assert last.done and not any(p.done for p in parts[:-1])
    for response in (whole, last):
        assert response.model == DEFAULT_MODEL and response.done_reason in ("stop", "length")
        assert 0 < response.eval_count <= 24 and response.prompt_eval_count > 10
        assert response.total_duration >= response.eval_duration > 0
    other = client.chat(DEFAULT_MODEL, STORY, options={**options, "seed": 8})
    assert other.message.content != whole.message.content


def test_logprobs_come_with_every_token(client: ollama.Client) -> None:
    asked = {"logprobs": True, "top_logprobs": 3, "options": {**SAMPLED, "num_predict": 6}}
    whole = client.chat(DEFAULT_MODEL, STORY, **asked)
    assert len(whole.logprobs) == whole.eval_count == 6
    assert "".join(p.token for p in whole.logprobs) == whole.message.content
    for position in whole.logprobs:
        assert position.logprob <= 0 and len(position.top_logprobs) == 3
        best = max(t.logprob for t in position.top_logprobs)
        assert position.logprob <= best + 1e-6
    parts = list(client.chat(DEFAULT_MODEL, STORY, stream=True, **asked))
    streamed = [p for part in parts for p in part.logprobs or ()]
    assert [p.token for p in streamed] == [p.token for p in whole.logprobs]


def test_num_predict_ends_the_answer_with_length(client: ollama.Client) -> None:
    response = client.chat(DEFAULT_MODEL, STORY, options={**SAMPLED, "num_predict": 5})
    assert (response.eval_count, response.done_reason) == (5, "length")
    generated = client.generate(DEFAULT_MODEL, "Once upon a time", options={"num_predict": 3})
    assert (generated.eval_count, generated.done_reason) == (3, "length")


def test_a_stop_string_ends_the_answer_before_it(client: ollama.Client) -> None:
    options = {**SAMPLED, "num_predict": 40}
    free = client.generate(DEFAULT_MODEL, "Tell me a story.", options=options).response
    words = free.split()
    assert len(words) > 4, free
    stop = " " + words[3]
    stopped = client.generate(
        DEFAULT_MODEL, "Tell me a story.", options={**options, "stop": [stop]}
    )
    assert stopped.response == free[: free.index(stop)]
    assert stopped.done_reason == "stop"


def test_a_format_schema_is_followed(client: ollama.Client) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    question = [{"role": "user", "content": "Describe a person as JSON."}]
    response = client.chat(DEFAULT_MODEL, question, format=schema, options={"num_predict": 80})
    jsonschema.validate(json.loads(response.message.content), schema)
    generated = client.generate(DEFAULT_MODEL, "A person:", format=schema)
    jsonschema.validate(json.loads(generated.response), schema)


def test_a_tool_result_is_answered(client: ollama.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "Sunny, 24 degrees", "tool_name": "get_weather"},
    ]
    response = client.chat(DEFAULT_MODEL, history, tools=tools, options={"temperature": 0})
    assert response.message.content.strip() or response.message.tool_calls
    assert response.done and response.prompt_eval_count > 50  # the tools and the history


def test_generate_raw_and_context_continue_a_text(client: ollama.Client) -> None:
    first = client.generate(DEFAULT_MODEL, "The sky is", raw=True, options={"num_predict": 4})
    assert first.context and len(first.context) == first.prompt_eval_count + first.eval_count
    then = client.generate(
        DEFAULT_MODEL, " and", raw=True, context=first.context, options={"num_predict": 4}
    )
    assert then.prompt_eval_count > len(first.context)
    assert then.context[: len(first.context)] == first.context


def test_the_model_routes_describe_what_is_served(client: ollama.Client) -> None:
    [listed] = client.list().models
    assert listed.model == DEFAULT_MODEL and listed.size > 100_000_000
    assert (listed.details.family, listed.details.parameter_size) == ("llama", "135M")
    shown = client.show(DEFAULT_MODEL)
    assert shown.capabilities == ["completion", "tools"]
    assert "<|im_start|>" in shown.template
    assert shown.modelinfo["llama.context_length"] == 2048
    [running] = client.ps().models
    assert (running.model, running.context_length) == (DEFAULT_MODEL, 2048)
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat("llama3.2", STORY)
    assert missing.value.status_code == 404 and DEFAULT_MODEL in missing.value.error
    with pytest.raises(ollama.ResponseError, match="models are chosen") as refused:
        client.pull("llama3.2")
    assert refused.value.status_code == 400


def test_a_client_that_hangs_up_frees_its_sequence(default_server: ServerProcess) -> None:
    body = {
        "model": DEFAULT_MODEL,
        "prompt": "Tell me a long story.",
        "options": {"num_predict": 1500},
    }
    with (
        httpx.Client(base_url=default_server.url, timeout=60) as c,
        c.stream("POST", "/api/generate", json=body) as response,
    ):
        for line in response.iter_lines():
            assert not json.loads(line)["done"]
            break
    m = default_server.wait_idle(timeout=10)
    assert m["trio_llm_num_requests_running"] == 0
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]


# -- /api/embed --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embed_server() -> Iterator[ServerProcess]:
    with run_server(f"{DEFAULT_EMBEDDING_MODEL}:dtype=float32", "--shutdown-timeout", "2") as s:
        yield s


@pytest.fixture(scope="module")
def embedder(embed_server: ServerProcess) -> Iterator[ollama.Client]:
    with ollama.Client(host=embed_server.url, timeout=60) as client:
        yield client


def test_embed_gives_unit_vectors_and_the_legacy_route_the_models_own(
    embed_server: ServerProcess, embedder: ollama.Client
) -> None:
    client = embedder
    texts = ["A cat sits on the mat.", "A dog lies on the rug.", "Stock markets fell today."]
    response = client.embed(DEFAULT_EMBEDDING_MODEL, texts)
    vectors = np.array(response.embeddings)
    assert vectors.shape == (3, 384) and response.prompt_eval_count > 12
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar, far = vectors[0] @ vectors[1], vectors[0] @ vectors[2]
    assert similar > far
    openai_body = {"model": DEFAULT_EMBEDDING_MODEL, "input": texts[0]}
    reference = httpx.post(embed_server.url + "/v1/embeddings", json=openai_body, timeout=60)
    own = np.array(reference.json()["data"][0]["embedding"])
    legacy = client.embeddings(DEFAULT_EMBEDDING_MODEL, texts[0]).embedding
    assert np.allclose(legacy, own, atol=1e-6)
    assert np.allclose(vectors[0], own / np.linalg.norm(own), atol=1e-5)


def test_embed_truncates_unless_told_not_to(embedder: ollama.Client) -> None:
    client = embedder
    long = "word " * 2000
    assert len(client.embed(DEFAULT_EMBEDDING_MODEL, long).embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as error:
        client.embed(DEFAULT_EMBEDDING_MODEL, long, truncate=False)
    assert error.value.status_code == 400
