"""The Messages API without a model: Anthropic's SDK (and raw SSE, for the exact event order)
over a fake engine that writes scripted thinking, answers and tool calls a character at a time;
the request's conversion (system, blocks, tool history, prefill), the errors in Anthropic's
shape, x-api-key, count_tokens, and the plan and builders on plain values."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import msgspec
import pytest
from http_fake_engine import FakeEngine

from trio_llm.http import ServerConfig, build_app
from trio_llm.http.answer import AnswerReader
from trio_llm.http.anthropic.build import MessagesStream, message_response
from trio_llm.http.anthropic.plan import plan_messages
from trio_llm.http.anthropic.protocol import MessagesRequest
from trio_llm.http.anthropic.signing import PROCESS_KEY, sign, thinking_key
from trio_llm.http.errors import ProtocolError
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.outputs import CompletionOutput, RequestMetrics, RequestOutput

THINKING_TEMPLATE = "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
"""What the fake engine's model shows of its template: it thinks (`auto` picks qwen3) and
reads `enable_thinking`."""

CALL = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(
        max_model_len=4096,
        chat_template=THINKING_TEMPLATE,
        outputs=["<think>\nLet me think: é🙂.\n</think>\n\nHello there!"],
    )


@pytest.fixture
async def url(engine: FakeEngine, serve_app: Any) -> str:
    return await serve_app(build_app(engine, config=ServerConfig(api_key="sekrit")))


@pytest.fixture
async def sdk(url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(base_url=url, api_key="sekrit", max_retries=0) as client:
        yield client


SAMPLING = ("temperature", "top_p", "top_k")
"""Fields this SDK version no longer takes as arguments (Claude's newest models refuse them);
older SDKs and other clients send them, so they travel in extra_body here."""


async def create(sdk: anthropic.AsyncAnthropic, **extra: Any) -> Any:
    request: dict[str, Any] = {"model": "fake-model", "max_tokens": 100, "messages": HELLO}
    sampling = {k: extra.pop(k) for k in SAMPLING if k in extra}
    return await sdk.messages.create(**{**request, **extra}, extra_body=sampling or None)


async def events(url: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The stream's events as (event line, data) pairs, in order."""
    out = []
    async with (
        httpx.AsyncClient(base_url=url, headers={"x-api-key": "sekrit"}) as client,
        client.stream("POST", "/v1/messages", json={**body, "stream": True}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data = json.loads(line.removeprefix("data: "))
                assert data["type"] == name
                out.append((name, data))
    return out


# -- messages.create ---------------------------------------------------------------------------


async def test_a_thinking_answer_comes_as_a_thinking_block_then_text(
    sdk: anthropic.AsyncAnthropic,
) -> None:
    message = await create(sdk, system="Be brief.", temperature=0.5, top_k=5, top_p=0.9)
    assert message.id.startswith("msg_") and message.type == "message"
    assert (message.role, message.model, message.stop_reason) == (
        "assistant",
        "fake-model",
        "end_turn",
    )
    thinking, text = message.content
    assert (thinking.type, thinking.thinking) == ("thinking", "Let me think: é🙂.")
    assert thinking.signature
    assert (text.type, text.text) == ("text", "Hello there!")
    assert message.usage.output_tokens == len(
        "<think>\nLet me think: é🙂.\n</think>\n\nHello there!"
    )
    assert message.usage.input_tokens > 0 and message.usage.cache_read_input_tokens == 0


async def test_the_request_reaches_the_engine_as_asked(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    await create(
        sdk,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        temperature=0.5,
        top_k=5,
        top_p=0.9,
        stop_sequences=["STOP"],
        metadata={"user_id": "u1"},
        thinking={"type": "disabled"},
    )
    [params] = engine.params.values()
    assert (params.temperature, params.top_k, params.top_p) == (0.5, 5, 0.9)
    assert (params.max_tokens, params.stop, params.constraint) == (100, ["STOP"], None)
    [prompt] = engine.prompts.values()
    assert "".join(map(chr, prompt)) == "<system>Be brief.\nBe kind.<user>Hello<assistant>"
    assert engine.template_kwargs == [{"enable_thinking": False}]


async def test_a_thinking_budget_constrains_the_thinking_only(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    await create(sdk, thinking={"type": "enabled", "budget_tokens": 50})
    [params] = engine.params.values()
    assert params.constraint is not None and params.constraint.thinking is not None
    assert (params.constraint.thinking.budget, params.constraint.thinking.inside) == (50, False)
    assert engine.template_kwargs == [{"enable_thinking": True}]


async def test_a_template_that_opens_the_block_is_thinking_from_the_first_character(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    engine.generation_prompt = "<think>\n"
    engine.outputs = ["Hmm, 2 > 1.</think>\n\nYes."]
    message = await create(sdk, thinking={"type": "enabled", "budget_tokens": 8})
    assert [(b.type, getattr(b, "thinking", None) or b.text) for b in message.content] == [
        ("thinking", "Hmm, 2 > 1."),
        ("text", "Yes."),
    ]
    [params] = engine.params.values()
    assert params.constraint is not None and params.constraint.thinking is not None
    assert params.constraint.thinking.inside


async def test_an_output_schema_follows_the_thinking(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    engine.outputs = ['<think>x</think>{"a": 1}']
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    message = await create(sdk, output_config={"format": {"type": "json_schema", "schema": schema}})
    assert json.loads(message.content[-1].text) == {"a": 1}
    [params] = engine.params.values()
    assert params.constraint is not None and json.loads(params.constraint.spec) == schema
    assert params.constraint.thinking is not None


async def test_tool_use_blocks_and_the_history_of_calls(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    engine.outputs = ["<think>Weather?</think>Checking. " + CALL]
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "old thoughts",
                    "signature": sign("old thoughts", PROCESS_KEY),
                },
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                {"type": "text", "text": "And Paris?"},
            ],
        },
    ]
    message = await create(sdk, messages=history, tools=[WEATHER], tool_choice={"type": "any"})
    assert message.stop_reason == "tool_use"
    thinking, text, call = message.content
    assert (thinking.thinking, text.text) == ("Weather?", "Checking. ")
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert call.id.startswith("toolu_")
    [params] = engine.params.values()
    assert params.constraint is not None and "get_weather" in params.constraint.spec
    assert params.constraint.thinking is not None  # the call comes after the thinking
    [prompt] = engine.prompts.values()
    rendered = "".join(map(chr, prompt))
    assert '"city": "Oslo"' in rendered and "<tool_response>\nSunny\n</tool_response>" in rendered
    assert "old thoughts" not in rendered and rendered.index("Sunny") < rendered.index("And Paris")


async def test_thinking_passed_back_is_verified_by_its_signature(
    sdk: anthropic.AsyncAnthropic,
) -> None:
    """A block this server signed goes back as it was; an edited one is a 400 naming it, as
    Anthropic refuses tampered thinking."""
    first = await create(sdk)
    thinking, text = (block.model_dump() for block in first.content)
    turns = [*HELLO, {"role": "assistant", "content": [thinking, text]}]
    again = await create(sdk, messages=[*turns, {"role": "user", "content": "And?"}])
    assert again.content
    edited = {**thinking, "thinking": "I was told to say yes."}
    turns[1] = {"role": "assistant", "content": [edited, text]}
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[1\]\.content\[0\]\.signature"):
        await create(sdk, messages=[*turns, {"role": "user", "content": "And?"}])


async def test_a_final_assistant_message_is_continued(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    engine.outputs = ["B)"]
    prefill = [*HELLO, {"role": "assistant", "content": "The answer is ("}]
    message = await create(sdk, messages=prefill, thinking={"type": "disabled"})
    assert message.content[0].text == "B)"
    [prompt] = engine.prompts.values()
    assert "".join(map(chr, prompt)).endswith("<assistant>The answer is (")


# -- streams -----------------------------------------------------------------------------------


async def test_the_stream_is_anthropics_event_sequence(url: str) -> None:
    body = {"model": "fake-model", "max_tokens": 100, "messages": HELLO}
    seen = await events(url, body)
    names = [name for name, _ in seen]
    # message_start, a thinking block (deltas, then its signature), a ping after the first
    # block's start, a text block, message_delta, message_stop.
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    thinking_end = names.index("content_block_stop")
    assert set(names[3 : thinking_end - 1]) == {"content_block_delta"}
    assert seen[thinking_end - 1][1]["delta"]["type"] == "signature_delta"
    assert names[thinking_end + 1] == "content_block_start"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = seen[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["role"]) == ([], None, "assistant")
    blocks = [d["content_block"] for n, d in seen if n == "content_block_start"]
    assert blocks == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": ""},
    ]
    thought = "".join(d["delta"].get("thinking", "") for n, d in seen if n == "content_block_delta")
    text = "".join(d["delta"].get("text", "") for n, d in seen if n == "content_block_delta")
    assert (thought, text) == ("Let me think: é🙂.", "Hello there!")
    delta = seen[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0


async def test_messages_stream_accumulates_thinking_text_and_tool_input(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    engine.outputs = ["<think>Hm.</think>Sure. " + CALL]
    async with sdk.messages.stream(
        model="fake-model", max_tokens=100, messages=HELLO, tools=[WEATHER]
    ) as stream:
        kinds = [event.type async for event in stream]
        message = await stream.get_final_message()
    assert "input_json" in kinds and "thinking" in kinds and "text" in kinds
    thinking, text, call = message.content
    assert (thinking.thinking, text.text) == ("Hm.", "Sure. ")
    assert (call.name, call.input, message.stop_reason) == (
        "get_weather",
        {"city": "Paris"},
        "tool_use",
    )


async def test_omitted_thinking_keeps_only_its_signature(
    sdk: anthropic.AsyncAnthropic, url: str
) -> None:
    thinking = {"type": "enabled", "budget_tokens": 50, "display": "omitted"}
    message = await create(sdk, thinking=thinking)
    block, text = message.content
    assert (block.type, block.thinking, text.text) == ("thinking", "", "Hello there!")
    assert block.signature
    body = {"model": "fake-model", "max_tokens": 100, "messages": HELLO, "thinking": thinking}
    deltas = [d["delta"]["type"] for n, d in await events(url, body) if n == "content_block_delta"]
    assert "thinking_delta" not in deltas and deltas[0] == "signature_delta"


async def test_an_answer_without_thinking_streams_one_text_block(
    url: str, engine: FakeEngine
) -> None:
    engine.chat_template = None  # no reasoning parser: `<think>` would be text
    engine.outputs = ["Plain <think>."]
    seen = await events(url, {"model": "fake-model", "max_tokens": 100, "messages": HELLO})
    names = [name for name, _ in seen]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names.count("content_block_start") == 1
    text = "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta")
    assert text == "Plain <think>."


# -- errors, keys, count_tokens ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "status", "kind", "where"),
    [
        ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "claude-other"}, 404, "not_found_error", "claude-other"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "invalid_request_error",
            "messages[0].content[0]",
        ),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            400,
            "invalid_request_error",
            "tools[0].type",
        ),
        (
            {"tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER]},
            400,
            "invalid_request_error",
            "nope",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 500}},
            400,
            "invalid_request_error",
            "budget_tokens",
        ),
        ({"stop_sequences": [""]}, 400, "invalid_request_error", "stop_sequences"),
        ({"temperature": -1}, 400, "invalid_request_error", "temperature"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_request_error", "role"),
        (
            {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
            400,
            "invalid_request_error",
            "mcp_servers",
        ),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            400,
            "invalid_request_error",
            "context_management",
        ),
    ],
)
async def test_errors_come_in_anthropics_shape(
    url: str, change: dict[str, Any], status: int, kind: str, where: str
) -> None:
    body = {"model": "fake-model", "max_tokens": 100, "messages": HELLO, **change}
    body = {k: v for k, v in body.items() if v is not None}
    async with httpx.AsyncClient(base_url=url, headers={"x-api-key": "sekrit"}) as client:
        response = await client.post("/v1/messages", json=body)
    assert response.status_code == status
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert where in error["error"]["message"]


async def test_a_field_anthropic_does_not_know_is_refused_as_anthropic_refuses_it(
    sdk: anthropic.AsyncAnthropic, url: str
) -> None:
    """Anthropic's own answer (a pydantic 400); the fields it documents are accepted."""
    async with httpx.AsyncClient(base_url=url, headers={"x-api-key": "sekrit"}) as client:
        body = {"model": "fake-model", "messages": HELLO, "top_n": 2}
        for path, extra in (("/v1/messages", {"max_tokens": 9}), ("/v1/messages/count_tokens", {})):
            response = await client.post(path, json={**body, **extra})
            assert response.status_code == 400
            assert response.json()["error"] == {
                "type": "invalid_request_error",
                "message": "top_n: Extra inputs are not permitted",
            }
    accepted = await sdk.messages.create(
        model="fake-model",
        max_tokens=9,
        messages=HELLO,  # type: ignore[arg-type]
        service_tier="auto",
        inference_geo="us",
        cache_control={"type": "ephemeral"},
        extra_body={"speed": "standard", "container": None, "context_management": {"edits": []}},
        extra_headers={"anthropic-beta": "context-management-2025-06-27"},
    )
    assert accepted.content


async def test_the_sdk_raises_its_own_errors(sdk: anthropic.AsyncAnthropic, url: str) -> None:
    with pytest.raises(anthropic.NotFoundError):
        await create(sdk, model="claude-sonnet-4-5")
    with pytest.raises(anthropic.BadRequestError, match="takes text only, not images"):
        image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
        await create(sdk, messages=[{"role": "user", "content": [image]}])
    async with anthropic.AsyncAnthropic(base_url=url, api_key="wrong", max_retries=0) as wrong:
        with pytest.raises(anthropic.AuthenticationError):
            await create(wrong)
    # The bearer header (auth_token) is accepted as well as x-api-key.
    async with anthropic.AsyncAnthropic(base_url=url, auth_token="sekrit", max_retries=0) as bearer:
        assert (await create(bearer)).content


async def test_count_tokens_counts_the_rendered_prompt_tools_included(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    plain = await sdk.messages.count_tokens(model="fake-model", messages=HELLO, system="Be brief.")
    assert plain.input_tokens == len("<system>Be brief.<user>Hello<assistant>")
    with_tools = await sdk.messages.count_tokens(
        model="fake-model", messages=HELLO, tools=[WEATHER]
    )
    assert with_tools.input_tokens > plain.input_tokens
    assert not engine.params  # nothing was generated


# -- plan and builders on plain values ----------------------------------------------------------


def plan(key: bytes = PROCESS_KEY, **body: Any) -> Any:
    request = msgspec.convert(
        {"model": "m", "max_tokens": 10, "messages": HELLO, **body}, MessagesRequest
    )
    return plan_messages(request, RequestLimits(), SamplingDefaults(), key)


def test_tool_choice_maps_onto_http_tools() -> None:
    assert plan(tools=[WEATHER]).conversation.tool_choice == "auto"
    any_ = plan(tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert (any_.conversation.tool_choice, any_.conversation.parallel_tool_calls) == (
        "required",
        False,
    )
    named = plan(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    assert named.conversation.tool_choice.name == "get_weather"
    assert plan(tools=[WEATHER], tool_choice={"type": "none"}).conversation.tool_choice == "none"
    with pytest.raises(ProtocolError, match="tool_choice"):
        plan(tool_choice={"type": "any"})


def test_verified_thinking_goes_to_the_template_as_reasoning_content() -> None:
    """The template shows it again or drops it (Qwen3's keeps a tool loop's, drops earlier
    turns'); a signature made with another secret does not verify."""
    key = thinking_key("a shared secret")
    block = {"type": "thinking", "thinking": "Hmm.", "signature": sign("Hmm.", key)}
    turns = [*HELLO, {"role": "assistant", "content": [block, {"type": "text", "text": "Hi"}]}]
    messages = plan(key, messages=[*turns, *HELLO]).conversation.messages
    assert messages[1] == {"role": "assistant", "content": "Hi", "reasoning_content": "Hmm."}
    with pytest.raises(ProtocolError) as refused:
        plan(messages=[*turns, *HELLO])  # the process's own key
    assert (refused.value.status, refused.value.param) == (400, "messages[1].content[0].signature")
    # An omitted block (display: omitted) comes back empty: its signature carries the thinking.
    omitted = {**block, "thinking": ""}
    turns[1] = {"role": "assistant", "content": [omitted]}
    assert plan(key, messages=[*turns, *HELLO]).conversation.messages[1]["reasoning_content"] == (
        "Hmm."
    )
    forged = {**block, "signature": block["signature"][:-4] + "AAA="}
    turns[1] = {"role": "assistant", "content": [forged]}
    with pytest.raises(ProtocolError, match=r"messages\[1\]\.content\[0\]\.signature"):
        plan(key, messages=[*turns, *HELLO])


def output(text: str, finish: str = "stop", stop: str | int | None = None) -> RequestOutput:
    o = CompletionOutput(0, text, [1] * len(text), finish_reason=finish, stop_reason=stop)
    return RequestOutput("r", None, [1, 2, 3], [o], True, RequestMetrics(0.0), num_cached_tokens=2)


def test_stop_reasons_and_usage() -> None:
    made = message_response("msg_1", "m", output("Hi", "stop", "END"), AnswerReader())
    assert (made.stop_reason, made.stop_sequence) == ("stop_sequence", "END")
    assert (made.usage.input_tokens, made.usage.cache_read_input_tokens) == (1, 2)
    cut = message_response("msg_1", "m", output("Hi", "length"), AnswerReader())
    assert (cut.stop_reason, cut.stop_sequence) == ("max_tokens", None)
    eos = message_response("msg_1", "m", output("Hi", "stop", 2), AnswerReader())
    assert eos.stop_reason == "end_turn"


def test_the_streams_first_and_last_usage_agree_with_the_message() -> None:
    """message_start waits for the first output: the prefix cache's share is known then."""
    stream = MessagesStream("msg_1", "m", 3, AnswerReader())
    assert stream.begin() == []
    start, *_ = stream.feed(0, output("Hi"))
    *_, delta, _ = stream.end()
    whole = message_response("msg_1", "m", output("Hi"), AnswerReader()).usage
    assert (whole.input_tokens, whole.cache_read_input_tokens) == (1, 2)
    assert (start.message.usage.input_tokens, start.message.usage.cache_read_input_tokens) == (1, 2)
    assert (delta.usage.input_tokens, delta.usage.cache_read_input_tokens) == (1, 2)


def test_a_failed_stream_ends_with_an_error_event() -> None:
    stream = MessagesStream("msg_1", "m", 3, AnswerReader())
    [error] = stream.fail(ProtocolError(500, "The engine died", code="engine_dead"))
    assert msgspec.to_builtins(error) == {
        "type": "error",
        "error": {"type": "api_error", "message": "The engine died"},
    }
    [overloaded] = stream.fail(ProtocolError(503, "busy"))
    assert overloaded.error.type == "overloaded_error"


def test_a_tool_results_picture_renders_before_the_messages_own() -> None:
    """A screenshot tool's picture in a tool_result becomes the tool message's image marker;
    the tool messages render before the user's text, so their pictures come first, whatever
    the order of the blocks."""
    from trio_llm.http.anthropic.plan import conversation_messages
    from trio_llm.http.conversation import IMAGE_MARKER, ImageRef

    def image(name: str) -> dict[str, Any]:
        return {"type": "image", "source": {"type": "url", "url": f"http://x/{name}.png"}}

    shot = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image("screen")]}
    request = msgspec.convert(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "Take a screenshot."},
                {"role": "assistant", "content": [shot]},
                {"role": "user", "content": [image("photo"), result]},
            ],
        },
        MessagesRequest,
    )
    images: list[ImageRef] = []
    messages, _ = conversation_messages(request, PROCESS_KEY, images)
    assert [m["role"] for m in messages[-2:]] == ["tool", "user"]
    assert messages[-2]["content"] == IMAGE_MARKER
    assert messages[-1]["content"] == IMAGE_MARKER
    assert [(i.url, i.param) for i in images] == [
        ("http://x/screen.png", "messages[2].content[1].content[0].source"),
        ("http://x/photo.png", "messages[2].content[0].source"),
    ]
