"""The Responses API through the real server on the default model, driven by the official
OpenAI SDK: `responses.create` (text, json_schema), `responses.parse`, `responses.stream` and
`create(stream=True)` with the events in order, retrieve, delete, store false,
previous_response_id chaining, logprobs, function tools (a required call, its output sent back
through previous_response_id; a named call streamed), and the SDK's errors for an unknown id
and an unsupported tool.
On the session's shared server (conftest.py's `default_server`)."""

from __future__ import annotations

import json

import httpx
import openai
import pydantic
import pytest

from http_server_process import ServerProcess
from trio_llm.config import DEFAULT_MODEL

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France? Answer in one word."


def test_create_answers_with_text_and_usage(default_sdk: openai.OpenAI) -> None:
    response = default_sdk.responses.create(
        model=DEFAULT_MODEL, input=QUESTION, temperature=0, max_output_tokens=32
    )
    assert response.id.startswith("resp_") and response.model == DEFAULT_MODEL
    assert response.status == "completed", response
    assert "Paris" in response.output_text
    assert response.output[0].type == "message"
    usage = response.usage
    assert usage is not None and usage.input_tokens > 5 and 0 < usage.output_tokens <= 32
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_max_output_tokens_makes_it_incomplete(default_sdk: openai.OpenAI) -> None:
    response = default_sdk.responses.create(
        model=DEFAULT_MODEL, input="Write a long story about a dragon.", max_output_tokens=4
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 4


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)


def test_text_format_json_schema(default_sdk: openai.OpenAI) -> None:
    schema = City.model_json_schema()
    response = default_sdk.responses.create(
        model=DEFAULT_MODEL,
        input="Describe Paris as JSON.",
        instructions="You answer in JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema}},
        temperature=0,
        max_output_tokens=64,
    )
    assert response.status == "completed"
    City.model_validate(json.loads(response.output_text))
    parsed = default_sdk.responses.parse(
        model=DEFAULT_MODEL,
        input="Describe Paris as JSON.",
        text_format=City,
        temperature=0,
        max_output_tokens=64,
    )
    assert isinstance(parsed.output_parsed, City)


EVENT_ORDER = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def _collapsed(types: list[str]) -> list[str]:
    """The event types with runs of deltas as one."""
    return [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]]


def test_stream_helper_sees_the_events_in_order(default_sdk: openai.OpenAI) -> None:
    with default_sdk.responses.stream(
        model=DEFAULT_MODEL, input=QUESTION, temperature=0, max_output_tokens=32
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert _collapsed([e.type for e in events]) == EVENT_ORDER
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and "Paris" in deltas
    assert default_sdk.responses.retrieve(final.id).output_text == final.output_text


def test_create_with_stream_true(default_sdk: openai.OpenAI) -> None:
    events = list(
        default_sdk.responses.create(
            model=DEFAULT_MODEL, input=QUESTION, temperature=0, max_output_tokens=32, stream=True
        )
    )
    assert _collapsed([e.type for e in events]) == EVENT_ORDER
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "completed" and final.usage.output_tokens > 0


def test_retrieve_delete_and_store_false(default_sdk: openai.OpenAI) -> None:
    response = default_sdk.responses.create(model=DEFAULT_MODEL, input="Hi!", max_output_tokens=8)
    assert default_sdk.responses.retrieve(response.id).output_text == response.output_text
    default_sdk.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        default_sdk.responses.retrieve(response.id)
    unstored = default_sdk.responses.create(
        model=DEFAULT_MODEL, input="Hi!", max_output_tokens=8, store=False
    )
    with pytest.raises(openai.NotFoundError) as caught:
        default_sdk.responses.retrieve(unstored.id)
    assert caught.value.body == {
        "message": f"Response with id '{unstored.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_previous_response_id_continues_the_conversation(
    default_sdk: openai.OpenAI, default_server: ServerProcess
) -> None:
    first = default_sdk.responses.create(
        model=DEFAULT_MODEL,
        input="My name is Zorblax. Say hello to me.",
        temperature=0,
        max_output_tokens=16,
    )
    second = default_sdk.responses.create(
        model=DEFAULT_MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=16,
    )
    assert first.usage is not None and second.usage is not None
    # The second prompt holds the first turn (question and answer) and then its own.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # Exactly: the conversation as chat messages, rendered by the chat template.
    conversation = [
        {"role": "user", "content": "My name is Zorblax. Say hello to me."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    tokens = httpx.post(
        default_server.url + "/tokenize", json={"messages": conversation}, timeout=30
    )
    assert tokens.json()["count"] == second.usage.input_tokens
    alone = default_sdk.responses.create(
        model=DEFAULT_MODEL, input="What is my name?", temperature=0, max_output_tokens=16
    )
    assert alone.usage is not None and alone.usage.input_tokens < second.usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        default_sdk.responses.create(
            model=DEFAULT_MODEL, input="x", previous_response_id="resp_unknown"
        )


def test_unsupported_tool_is_a_400(default_sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        default_sdk.responses.create(
            model=DEFAULT_MODEL, input="Search the web.", tools=[{"type": "web_search"}]
        )
    assert caught.value.body["param"] == "tools[0].type"  # type: ignore[index]
    assert "web_search" in caught.value.body["message"]  # type: ignore[index]


def test_logprobs_when_included(default_sdk: openai.OpenAI) -> None:
    fields = {
        "model": DEFAULT_MODEL,
        "input": QUESTION,
        "temperature": 0,
        "max_output_tokens": 8,
        "top_logprobs": 2,
        "include": ["message.output_text.logprobs"],
    }
    response = default_sdk.responses.create(**fields)  # type: ignore[call-overload]
    part = response.output[0].content[0]  # type: ignore[union-attr]
    # As on chat, the tokens include the end-of-turn token that stopped the text.
    assert part.logprobs and "".join(lp.token for lp in part.logprobs).startswith(part.text)
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)
    events = list(default_sdk.responses.create(**fields, stream=True))  # type: ignore[call-overload]
    streamed = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [lp.token for lp in part.logprobs]
    plain = default_sdk.responses.create(model=DEFAULT_MODEL, input=QUESTION, max_output_tokens=4)
    assert plain.output[0].content[0].logprobs == []  # type: ignore[union-attr]


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_a_required_function_call_and_its_output(default_sdk: openai.OpenAI) -> None:
    first = default_sdk.responses.create(
        model=DEFAULT_MODEL,
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert call.id is not None and call.id.startswith("fc_")
    second = default_sdk.responses.create(
        model=DEFAULT_MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}],
        tools=[WEATHER],  # type: ignore[list-item]
        temperature=0,
        max_output_tokens=32,
    )
    assert second.status in ("completed", "incomplete")
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_streamed_function_call(default_sdk: openai.OpenAI) -> None:
    with default_sdk.responses.stream(
        model=DEFAULT_MODEL,
        input="What is the weather in Tokyo?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=64,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = _collapsed([e.type for e in events])
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in types
    assert types[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    streamed = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert streamed == call.arguments and "city" in json.loads(call.arguments)
