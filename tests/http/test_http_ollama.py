"""Ollama's API without a model: Ollama's own Python client (and raw httpx, for the NDJSON
framing) over a fake engine that writes scripted thinking, answers and tool calls a character
at a time: chat and generate streamed and not, options mapped, ignored or refused by name,
tool calls with object arguments and their history, think, format, generate's raw, system and
context, embeddings, the model routes, the refused management routes, errors in Ollama's
shape (mid-stream too), the API key, and a client that goes away aborting its request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from functools import partial
from typing import Any

import httpx
import ollama
import pytest
import trio
from http_fake_engine import FakeEngine

from trio_llm.client.errors import EngineRequestError
from trio_llm.constraint import ConstraintKind
from trio_llm.http import ServerConfig, build_app

THINKING_TEMPLATE = "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
"""What the fake engine's model shows of its template: it thinks (`auto` picks qwen3) and
reads `enable_thinking`."""
ANSWER = "<think>\nLet me think: é🙂.\n</think>\n\nHello there!"
CALL = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
WEATHER = {
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
HELLO = [{"role": "user", "content": "Hello"}]
KEY = {"Authorization": "Bearer sekrit"}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=4096, chat_template=THINKING_TEMPLATE, outputs=[ANSWER])


@pytest.fixture
async def url(engine: FakeEngine, serve_app: Any) -> str:
    return await serve_app(build_app(engine, config=ServerConfig(api_key="sekrit")))


@pytest.fixture
async def client(url: str) -> AsyncIterator[ollama.AsyncClient]:
    yield ollama.AsyncClient(host=url, headers=KEY)


def rendered(engine: FakeEngine) -> str:
    [prompt] = engine.prompts.values()
    return "".join(map(chr, prompt))


async def post(url: str, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers=KEY) as c:
        return await c.post(path, json=body, **kwargs)


# -- /api/chat ---------------------------------------------------------------------------------


async def test_chat_answers_with_thinking_and_ollamas_final_fields(
    client: ollama.AsyncClient,
) -> None:
    response = await client.chat(model="fake-model", messages=HELLO)
    assert (response.message.role, response.message.content) == ("assistant", "Hello there!")
    assert response.message.thinking == "Let me think: é🙂."
    assert (response.done, response.done_reason, response.model) == (True, "stop", "fake-model")
    assert response.eval_count == len(ANSWER)
    assert response.prompt_eval_count == len("<user>Hello<assistant>")
    assert response.total_duration > 0 and response.load_duration == 0
    assert response.prompt_eval_duration >= 0 and response.eval_duration >= 0
    assert datetime.fromisoformat(response.created_at).tzinfo is not None


async def test_chat_streams_by_default_as_ndjson(url: str, client: ollama.AsyncClient) -> None:
    async with (
        httpx.AsyncClient(base_url=url, headers=KEY) as c,
        c.stream("POST", "/api/chat", json={"model": "fake-model", "messages": HELLO}) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) async for line in r.aiter_lines() if line]
    *pieces, last = lines
    assert not any(p["done"] for p in pieces) and last["done"] is True
    assert "".join(p["message"].get("thinking", "") for p in pieces) == "Let me think: é🙂."
    assert "".join(p["message"]["content"] for p in pieces) == "Hello there!"
    assert last["done_reason"] == "stop" and last["eval_count"] == len(ANSWER)
    # The client's own stream reads the same.
    parts = [part async for part in await client.chat("fake-model", HELLO, stream=True)]
    assert "".join(p.message.content for p in parts) == "Hello there!"
    assert parts[-1].done and parts[-1].eval_count == len(ANSWER)


async def test_think_false_turns_the_templates_thinking_off(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.outputs = ["Plain."]
    response = await client.chat("fake-model", HELLO, think=False)
    assert response.message.content == "Plain." and not response.message.thinking
    assert engine.template_kwargs[-1]["enable_thinking"] is False


async def test_a_think_level_sets_the_templates_effort(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.chat_template = "{{ reasoning_effort }}" + THINKING_TEMPLATE
    response = await client.chat("fake-model", HELLO, think="high")
    assert response.message.thinking == "Let me think: é🙂."
    assert engine.template_kwargs[-1] == {"enable_thinking": True, "reasoning_effort": "high"}


async def test_think_on_a_model_that_does_not_think_is_refused(
    engine: FakeEngine, url: str
) -> None:
    engine.chat_template = None
    with pytest.raises(ollama.ResponseError) as error:
        await ollama.AsyncClient(host=url, headers=KEY).chat("fake-model", HELLO, think=True)
    assert error.value.status_code == 400
    assert "does not support thinking" in error.value.error


async def test_tool_calls_have_object_arguments_and_their_history_is_rendered(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.chat_template = None  # the server writes the tools into the system message
    engine.outputs = [CALL]
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": "Sunny", "tool_name": "get_weather"},
        {"role": "user", "content": "And Paris?"},
    ]
    response = await client.chat("fake-model", history, tools=[WEATHER])
    [call] = response.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
    assert response.message.content == "" and response.done_reason == "stop"
    prompt = rendered(engine)
    assert '"city": "Oslo"' in prompt and "<tool_response>\nSunny\n</tool_response>" in prompt
    assert "get_weather" in prompt.split("<user>")[0]  # the tools, in the system message
    [params] = engine.params.values()
    assert params.constraint is not None and "get_weather" in params.constraint.spec
    # Streamed, the call comes whole, in one object before the last.
    engine.prompts.clear()
    parts = [
        p async for p in await client.chat("fake-model", history, tools=[WEATHER], stream=True)
    ]
    calls = [c for p in parts for c in p.message.tool_calls or ()]
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert parts[-1].done and not parts[-1].message.tool_calls


async def test_format_schema_and_json_constrain_the_answer(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.chat_template, engine.outputs = None, ['{"city": "Paris"}']
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    response = await client.chat("fake-model", HELLO, format=schema)
    assert json.loads(response.message.content) == {"city": "Paris"}
    await client.chat("fake-model", HELLO, format="json")
    first, second = engine.params.values()
    assert first.constraint.kind == ConstraintKind.JSON_SCHEMA and "city" in first.constraint.spec
    assert second.constraint.kind == ConstraintKind.JSON_OBJECT


# -- options -----------------------------------------------------------------------------------


async def test_options_reach_the_engine(client: ollama.AsyncClient, engine: FakeEngine) -> None:
    options = {
        "temperature": 0.3,
        "top_p": 0.8,
        "top_k": 7,
        "min_p": 0.05,
        "seed": 42,
        "num_predict": 12,
        "stop": ["\n\n"],
        "repeat_penalty": 1.2,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repeat_last_n": -1,
        # Runtime settings: accepted, and they change nothing.
        "num_thread": 4,
        "num_gpu": 1,
        "num_batch": 64,
        "use_mmap": True,
        "num_keep": 5,
        "mirostat": 0,
        "typical_p": 1.0,
    }
    await client.chat("fake-model", HELLO, options=options, keep_alive="5m")
    [params] = engine.params.values()
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.3, 0.8, 7, 0.05)
    assert (params.seed, params.max_tokens, params.stop) == (42, 12, ["\n\n"])
    assert params.repetition_penalty == 1.2
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, 0.25)


async def test_unlimited_num_predict_and_a_zero_window(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    options = {"num_predict": -1, "repeat_last_n": 0, "repeat_penalty": 1.5}
    await client.chat("fake-model", HELLO, options=options)
    await client.chat("fake-model", HELLO, options={"num_predict": -2})
    first, second = engine.params.values()
    assert first.max_tokens is None and second.max_tokens is None
    assert first.repetition_penalty == 1.0  # no window: no penalty, as Ollama


async def test_num_ctx_smaller_than_the_served_context_bounds_the_answer(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    prompt = len("<user>Hello<assistant>")
    await client.chat("fake-model", HELLO, options={"num_ctx": prompt + 10})
    await client.chat("fake-model", HELLO, options={"num_ctx": 100_000})  # the served one rules
    small, large = engine.params.values()
    assert small.max_tokens == 10 and large.max_tokens is None
    with pytest.raises(ollama.ResponseError, match="num_ctx") as error:
        await client.chat("fake-model", HELLO, options={"num_ctx": prompt})
    assert error.value.status_code == 400


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"mirostat": 2}, "options.mirostat"),
        ({"tfs_z": 0.5}, "options.tfs_z"),
        ({"typical_p": 0.7}, "options.typical_p"),
        ({"repeat_last_n": 64, "repeat_penalty": 1.1}, "options.repeat_last_n"),
        ({"num_predict": 0}, "options.num_predict"),
        ({"temperature": -1}, "options.temperature"),
        ({"top_p": 2}, "options.top_p"),
        ({"stop": [""]}, "options.stop"),
        ({"seed": "x"}, "options.seed"),
    ],
)
async def test_an_option_that_cannot_be_honoured_is_refused_by_name(
    client: ollama.AsyncClient, engine: FakeEngine, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ollama.ResponseError) as error:
        await client.chat("fake-model", HELLO, options=options)
    assert error.value.status_code == 400 and named in error.value.error
    assert not engine.params  # nothing reached the engine


# -- /api/generate -----------------------------------------------------------------------------


async def test_generate_renders_system_and_prompt_and_returns_context(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.outputs = ["<think>Hm.</think>Because."]
    response = await client.generate("fake-model", "Why?", system="Be brief.")
    assert (response.response, response.thinking) == ("Because.", "Hm.")
    assert rendered(engine) == "<system>Be brief.<user>Why?<assistant>"
    assert response.context == [
        *map(ord, "<system>Be brief.<user>Why?<assistant>"),
        *map(ord, "<think>Hm.</think>Because."),
    ]
    # The context comes back before the next prompt, as Ollama's does.
    engine.prompts.clear()
    engine.outputs = ["More."]
    streamed = [
        p
        async for p in await client.generate("fake-model", "Go on", context=[72, 105], stream=True)
    ]
    assert rendered(engine) == "Hi<user>Go on<assistant>"
    assert "".join(p.response for p in streamed) == "More."
    assert streamed[-1].done and streamed[-1].context[:2] == [72, 105]


async def test_generate_raw_sends_the_prompt_as_written(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.outputs = ["<think>kept as text</think> done"]
    response = await client.generate("fake-model", "[INST] hi [/INST]", raw=True)
    assert rendered(engine) == "[INST] hi [/INST]"
    assert response.response == "<think>kept as text</think> done" and not response.thinking


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"suffix": "return x"}, "suffix"),
        ({"images": ["aGVsbG8="]}, "images"),
        ({"raw": True, "system": "x"}, "system"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
async def test_generate_refuses_what_it_cannot_do(
    url: str, fields: dict[str, Any], named: str
) -> None:
    response = await post(url, "/api/generate", {"model": "fake-model", "prompt": "x", **fields})
    assert response.status_code == 400
    assert named in response.json()["error"]


async def test_logprobs_are_asked_of_the_engine(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    await client.generate("fake-model", "x", logprobs=True, top_logprobs=3)
    await client.generate("fake-model", "x", logprobs=True)
    await client.generate("fake-model", "x")
    assert [p.logprobs for p in engine.params.values()] == [3, 0, None]


async def test_chat_refuses_images(client: ollama.AsyncClient) -> None:
    with pytest.raises(ollama.ResponseError, match="Image input") as error:
        await client.chat("fake-model", [{"role": "user", "content": "x", "images": [b"\x89PNG"]}])
    assert error.value.status_code == 400


async def test_an_empty_request_loads_the_model(url: str, engine: FakeEngine) -> None:
    chat = (await post(url, "/api/chat", {"model": "fake-model", "messages": []})).json()
    assert (chat["done"], chat["done_reason"]) == (True, "load")
    body = {"model": "fake-model", "keep_alive": 0}
    assert (await post(url, "/api/generate", body)).json()["done_reason"] == "unload"
    assert not engine.params


# -- errors ------------------------------------------------------------------------------------


async def test_an_unknown_model_is_a_404_naming_what_is_served(client: ollama.AsyncClient) -> None:
    with pytest.raises(ollama.ResponseError) as error:
        await client.chat("llama3.2", HELLO)
    assert error.value.status_code == 404
    assert error.value.error.startswith('model "llama3.2" not found')
    assert '"fake-model"' in error.value.error
    # `:latest` names the served model, as Ollama's tags do.
    assert (await client.chat("fake-model:latest", HELLO)).message.content == "Hello there!"


async def test_errors_are_ollamas_shape(url: str) -> None:
    for response in (
        await post(url, "/api/chat", {"model": "fake-model", "messages": "no"}),
        await post(url, "/api/chat", {"messages": HELLO}),
        await post(url, "/api/generate", {"model": "x", "prompt": "y"}),
    ):
        assert response.status_code in (400, 404)
        body = response.json()
        assert list(body) == ["error"] and isinstance(body["error"], str)
    async with httpx.AsyncClient(base_url=url) as anonymous:
        unauthorised = await anonymous.get("/api/tags")
    assert unauthorised.status_code == 401 and "API key" in unauthorised.json()["error"]


async def test_a_body_without_json_content_type_is_read(url: str) -> None:
    """What `curl -d '{...}'` sends, as in Ollama's docs."""
    body = json.dumps({"model": "fake-model", "prompt": "Why?", "stream": False})
    async with httpx.AsyncClient(base_url=url, headers=KEY) as c:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        response = await c.post("/api/generate", content=body, headers=form)
    assert response.status_code == 200 and response.json()["response"] == "Hello there!"


async def test_a_failure_after_the_200_is_an_error_line(
    client: ollama.AsyncClient, engine: FakeEngine
) -> None:
    engine.outputs = None
    engine.fail_with = EngineRequestError("the engine failed it")
    with pytest.raises(ollama.ResponseError, match="the engine failed it"):
        async for _ in await client.chat("fake-model", HELLO, stream=True):
            pass


async def test_a_client_that_goes_away_aborts_its_request(url: str, engine: FakeEngine) -> None:
    engine.outputs, engine.hold_after_first = None, True
    async with (
        httpx.AsyncClient(base_url=url, headers=KEY) as c,
        c.stream("POST", "/api/chat", json={"model": "fake-model", "messages": HELLO}) as r,
    ):
        async for _ in r.aiter_lines():
            break
        with trio.fail_after(5):
            await engine.wait_for(lambda: len(engine.running) == 1)
    with trio.fail_after(5):
        await engine.wait_for(lambda: not engine.running)
    assert len(engine.aborted) == 1
    # Not streamed: the same.
    async with (
        httpx.AsyncClient(base_url=url, headers=KEY) as c,
        trio.open_nursery() as nursery,
    ):
        body = {"model": "fake-model", "prompt": "x", "stream": False}
        nursery.start_soon(partial(c.post, "/api/generate", json=body))
        with trio.fail_after(5):
            await engine.wait_for(lambda: len(engine.running) == 1)
        nursery.cancel_scope.cancel()
    with trio.fail_after(5):
        await engine.wait_for(lambda: not engine.running)
    assert len(engine.aborted) == 2


# -- models and management ---------------------------------------------------------------------


async def test_tags_show_ps_and_version(client: ollama.AsyncClient) -> None:
    [listed] = (await client.list()).models
    assert listed.model == "fake-model" and len(listed.digest) == 64
    shown = await client.show("fake-model")
    assert shown.capabilities == ["completion", "tools", "thinking"]
    assert shown.template == THINKING_TEMPLATE
    assert "temperature" in shown.parameters and "FROM" in shown.modelfile
    assert shown.modelinfo[f"{shown.modelinfo['general.architecture']}.context_length"] == 4096
    [running] = (await client.ps()).models
    assert (running.model, running.context_length) == ("fake-model", 4096)
    async with httpx.AsyncClient(base_url=str(client._client.base_url), headers=KEY) as c:
        version = (await c.get("/api/version")).json()
    assert version["version"].count(".") == 2 and "trio_llm" in version


async def test_management_is_refused_with_the_reason(client: ollama.AsyncClient) -> None:
    assert (await client.pull("fake-model")).status == "success"  # already served
    refusals = [
        client.pull("llama3.2"),
        client.push("fake-model"),
        client.delete("fake-model"),
        client.copy("fake-model", "other"),
        client.create("mine", from_="fake-model"),
    ]
    for call in refusals:
        with pytest.raises(ollama.ResponseError, match="models are chosen") as error:
            await call
        assert error.value.status_code == 400


# -- embeddings --------------------------------------------------------------------------------


@pytest.fixture
async def embedder(serve_app: Any) -> ollama.AsyncClient:
    engine = FakeEngine(task="embed", name="fake-embed")
    return ollama.AsyncClient(host=await serve_app(build_app(engine)))


async def test_embed_returns_unit_vectors_and_the_token_count(embedder: ollama.AsyncClient) -> None:
    response = await embedder.embed("fake-embed", ["ab", "c"])
    assert len(response.embeddings) == 2
    for vector in response.embeddings:
        assert abs(sum(x * x for x in vector) - 1.0) < 1e-6
    a, b = ord("a"), ord("b")
    norm = (a * a + b * b) ** 0.5
    assert response.embeddings[0][:2] == pytest.approx([a / norm, b / norm])
    assert response.prompt_eval_count == 3 and response.model == "fake-embed"
    single = await embedder.embed("fake-embed", "ab")
    assert single.embeddings == response.embeddings[:1]
    legacy = await embedder.embeddings("fake-embed", "ab")
    assert legacy.embedding == [a, b, 0.0, 0.0]  # the model's own, not normalised


async def test_generating_and_embedding_models_keep_to_their_routes(
    embedder: ollama.AsyncClient, client: ollama.AsyncClient
) -> None:
    with pytest.raises(ollama.ResponseError, match="does not support generation"):
        await embedder.chat("fake-embed", HELLO)
    with pytest.raises(ollama.ResponseError, match="does not support embeddings"):
        await client.embed("fake-model", "x")
    assert (await embedder.show("fake-embed")).capabilities == ["embedding"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "options": {"top_k": 2**40}}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "options": {"seed": 2**70}}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "options": {"num_ctx": -5}}),
        (
            "/api/chat",
            {"model": "fake-model", "messages": HELLO, "options": {"num_predict": 2**40}},
        ),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "options": {"stop": ["x"] * 99}}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "options": []}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "format": "xml"}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "format": {"type": "nope"}}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "think": "extreme"}),
        ("/api/chat", {"model": "fake-model", "messages": HELLO, "tools": [{"type": "web"}]}),
        ("/api/chat", {"model": "fake-model", "messages": [{"content": "x"}]}),
        ("/api/generate", {"model": "fake-model", "prompt": "x", "context": [-1]}),
        ("/api/generate", {"model": "fake-model", "prompt": "x", "context": [10**6]}),
        ("/api/generate", {"model": "fake-model", "prompt": "x", "raw": True, "think": True}),
        ("/api/embed", {"model": "fake-model", "input": "x", "dimensions": 0}),
        ("/api/show", {}),
        ("/api/pull", {"model": 5}),
    ],
)
async def test_no_request_is_a_500(url: str, path: str, body: dict[str, Any]) -> None:
    response = await post(url, path, {**body, "stream": False})
    assert 400 <= response.status_code < 500, response.text
    assert isinstance(response.json()["error"], str)


async def test_the_openai_routes_still_stream_server_sent_events(url: str) -> None:
    """NDJSON is the Ollama builders' framing; every other stream stays SSE."""
    body = {"model": "fake-model", "messages": HELLO, "stream": True}
    async with (
        httpx.AsyncClient(base_url=url, headers=KEY) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.headers["content-type"].startswith("text/event-stream")
        text = (await r.aread()).decode()
    assert text.startswith("data: {") and text.endswith("data: [DONE]\n\n")
