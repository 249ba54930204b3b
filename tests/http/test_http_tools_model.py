"""Tool calling through the real server on the default model (SmolLM2-135M-Instruct, whose
template takes no tools: the server writes the tool block): forced calls validate against the
schema, `none` never calls, streamed deltas concatenate to valid arguments, a tool result is
answered, n=2 gives two calls, and examples/tool_agent.py runs its agent loop."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from http_server_process import ServerProcess
from trio_llm.config import DEFAULT_MODEL

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "tool_agent.py"

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
BOOKING = {
    "type": "object",
    "properties": {
        "guests": {"type": "integer", "minimum": 1, "maximum": 12},
        "date": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
        "vegetarian": {"type": "boolean"},
    },
    "required": ["guests", "date"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER, "book_table": BOOKING}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": WEATHER,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a restaurant table",
            "parameters": BOOKING,
        },
    },
]
QUESTIONS = [
    "What is the weather in Paris?",
    "Book a table for four people on 2026-05-01.",
    "Tell me a joke.",
]


@pytest.fixture(scope="module")
def sdk(default_server: ServerProcess) -> Iterator[openai.OpenAI]:
    url = default_server.url + "/v1"
    with openai.OpenAI(base_url=url, api_key="none", max_retries=0) as client:
        yield client


def ask(sdk: openai.OpenAI, question: str, **fields: Any) -> Any:
    """One call per answer unless a test asks for more: allowed to go on, this model lists
    call after call until max_tokens."""
    request = {
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": question}],
        "tools": TOOLS,
        "max_tokens": 120,
        "temperature": 0,
        "parallel_tool_calls": False,
        **fields,
    }
    return sdk.chat.completions.create(**request)


def assert_valid_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("question", QUESTIONS)
def test_required_calls_validate_against_the_schema(sdk: openai.OpenAI, question: str) -> None:
    choice = ask(sdk, question, tool_choice="required").choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        assert_valid_call(call.function.name, call.function.arguments)


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_a_named_function_is_the_one_called(sdk: openai.OpenAI, name: str) -> None:
    named = {"type": "function", "function": {"name": name}}
    # The question asks for the other tool: the choice still wins.
    choice = ask(sdk, QUESTIONS[name == "get_weather"], tool_choice=named).choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == name
    assert_valid_call(name, call.function.arguments)


@pytest.mark.parametrize("stream", [False, True])
def test_none_never_calls(sdk: openai.OpenAI, stream: bool) -> None:
    for question in QUESTIONS:
        if not stream:
            message = ask(sdk, question, tool_choice="none").choices[0].message
            assert message.tool_calls is None and message.content
            continue
        chunks = list(ask(sdk, question, tool_choice="none", stream=True))
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_streamed_deltas_concatenate_to_valid_arguments(sdk: openai.OpenAI) -> None:
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in ask(sdk, QUESTIONS[1], tool_choice="required", stream=True):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        assert not choice.delta.content  # no tag leaks into the content
        for delta in choice.delta.tool_calls or ():
            if delta.index not in calls:  # a call's first delta says what it is
                assert delta.id and delta.id.startswith("call_") and delta.type == "function"
                assert delta.function and delta.function.name
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.id is None
            calls[delta.index]["arguments"] += (delta.function and delta.function.arguments) or ""
    assert finish == "tool_calls" and calls
    for call in calls.values():
        assert_valid_call(call["name"], call["arguments"])


def test_parallel_calls_are_each_valid(sdk: openai.OpenAI) -> None:
    choice = ask(sdk, QUESTIONS[2], tool_choice="required", parallel_tool_calls=True).choices[0]
    calls = choice.message.tool_calls
    assert choice.finish_reason in ("tool_calls", "length") and calls
    if choice.finish_reason == "length":  # cut off inside its last call, as OpenAI's would be
        calls = calls[:-1]
    for call in calls:
        assert_valid_call(call.function.name, call.function.arguments)


def test_a_tool_result_is_answered(sdk: openai.OpenAI) -> None:
    first = ask(sdk, QUESTIONS[0], tool_choice="required").choices[0].message
    [call] = first.tool_calls[:1]
    messages: list[Any] = [
        {"role": "user", "content": QUESTIONS[0]},
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    reply = ask(sdk, "", messages=messages).choices[0]
    if reply.message.tool_calls:  # auto: a call is allowed, and then it is a valid one
        for again in reply.message.tool_calls:
            assert_valid_call(again.function.name, again.function.arguments)
    else:
        assert reply.message.content and reply.finish_reason in ("stop", "length")
    answer = ask(sdk, "", messages=messages, tool_choice="none").choices[0].message
    assert answer.content and answer.tool_calls is None


def test_two_choices_make_two_valid_calls(sdk: openai.OpenAI) -> None:
    reply = ask(sdk, QUESTIONS[0], tool_choice="required", n=2, temperature=1.0, seed=7)
    assert len(reply.choices) == 2
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            assert_valid_call(call.function.name, call.function.arguments)


def test_auto_calls_that_come_back_are_valid(sdk: openai.OpenAI) -> None:
    """Sampling freely, the model sometimes opens a call tag; from there the lazy grammar holds
    it to a valid call, so every call returned parses and validates."""

    def sample(seed: int) -> Any:
        return ask(sdk, QUESTIONS[seed % 2], temperature=1.0, seed=seed).choices[0]

    with ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(sample, range(8)))
    for choice in choices:
        for call in choice.message.tool_calls or ():
            assert_valid_call(call.function.name, call.function.arguments)
        if choice.message.tool_calls:
            assert choice.finish_reason in ("tool_calls", "length")


def test_the_agent_example_runs(default_server: ServerProcess) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), default_server.url],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("called get_weather(")
    assert len(lines) >= 2 and lines[-1].strip()
