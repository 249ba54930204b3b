"""The Messages API through the real server on the default model, driven by Anthropic's own
SDK as a user would: messages.create, messages.stream (its accumulated message equals the
events), tools with tool_choice any and a named tool (the input validates against the
schema), a tool result answered, stop_sequences, count_tokens. On the session's shared server
(conftest.py's `default_server`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import pytest

from http_server_process import ServerProcess
from trio_llm.config import DEFAULT_MODEL

pytestmark = pytest.mark.slow

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(default_server: ServerProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=default_server.url, api_key="none", max_retries=0) as client:
        yield client


def create(client: anthropic.Anthropic, **fields: Any) -> Any:
    request: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "Name a colour."}],
        **fields,
    }
    return client.messages.create(**request, extra_body={"temperature": 0})


def test_create_answers_with_text_and_usage(client: anthropic.Anthropic) -> None:
    message = create(client, system="Answer in one word.")
    [block] = message.content
    assert block.type == "text" and block.text.strip()
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.model == DEFAULT_MODEL and message.id.startswith("msg_")
    assert 0 < message.usage.output_tokens <= 40
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 10


def test_max_tokens_and_stop_sequences(client: anthropic.Anthropic) -> None:
    cut = create(client, max_tokens=3, messages=[{"role": "user", "content": "Count to 50."}])
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 3)
    counting = [{"role": "user", "content": "List the numbers from 1 to 10."}]
    stopped = create(client, max_tokens=60, messages=counting, stop_sequences=["4"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "4"
    assert "4" not in stopped.content[0].text


def test_the_stream_accumulates_to_the_same_message(client: anthropic.Anthropic) -> None:
    # The prompt's blocks cached first, so that the streamed and the created answer are both
    # computed on a prefix-cache hit: with batch invariance off (the default server's bf16
    # here), a hit and a miss may differ in a near-tie token (DESIGN.md's "In bf16 the tokens
    # depend on the batch"); two hits are computed alike.
    create(client, max_tokens=1, messages=QUESTION)
    with client.messages.stream(
        model=DEFAULT_MODEL, max_tokens=30, messages=QUESTION, extra_body={"temperature": 0}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0
    assert final.content[0].text == create(client, max_tokens=30, messages=QUESTION).content[0].text


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use_validates(
    client: anthropic.Anthropic, choice: dict[str, Any], stream: bool
) -> None:
    request = {
        "model": DEFAULT_MODEL,
        "max_tokens": 80,
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": {**choice, "disable_parallel_tool_use": True},
        "extra_body": {"temperature": 0},
    }
    if stream:
        with client.messages.stream(**request) as events:
            kinds = {event.type for event in events}
            message = events.get_final_message()
        assert "input_json" in kinds
    else:
        message = client.messages.create(**request)
    assert message.stop_reason == "tool_use"
    [call] = [b for b in message.content if b.type == "tool_use"]
    assert call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_a_tool_result_is_answered(client: anthropic.Anthropic) -> None:
    first = client.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=80,
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    call = next(b for b in first.content if b.type == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 degrees."}
    answer = client.messages.create(
        model=DEFAULT_MODEL,
        max_tokens=40,
        messages=[*QUESTION, first.to_param(), {"role": "user", "content": [result]}],
        tools=[WEATHER],
        tool_choice={"type": "none"},
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()


def test_count_tokens_matches_what_a_message_uses(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=DEFAULT_MODEL, messages=QUESTION)
    with_tools = client.messages.count_tokens(
        model=DEFAULT_MODEL, messages=QUESTION, tools=[WEATHER]
    )
    assert with_tools.input_tokens > counted.input_tokens > 10
    used = client.messages.create(model=DEFAULT_MODEL, max_tokens=1, messages=QUESTION).usage
    assert used.input_tokens + (used.cache_read_input_tokens or 0) == counted.input_tokens


def test_errors_are_the_sdks_own(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=5, messages=QUESTION)
    with pytest.raises(anthropic.BadRequestError, match="not images"):
        image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
        client.messages.create(
            model=DEFAULT_MODEL, max_tokens=5, messages=[{"role": "user", "content": [image]}]
        )
