"""Reasoning on the wire without a model: a fake engine whose template thinks writes scripted
thinking and answers a character at a time (so every character boundary is a chunk boundary);
the OpenAI SDK reads chat's `reasoning_content` (streamed and not) and the Responses API's
reasoning items and events; the thinking switches, budget and constraints reach the engine as
the request asked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pydantic
import pytest
from http_fake_engine import FakeEngine
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent

from trio_llm.http import ServerConfig, build_app

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
THINKING_TEMPLATE = (
    "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}{{ reasoning_effort }}"
)
THOUGHT = "A thought é🙂 with a < and </b>."
ANSWER = "The answer."
OUTPUT = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
CALL = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=4096, chat_template=THINKING_TEMPLATE, outputs=[OUTPUT])


@pytest.fixture
def config() -> ServerConfig:
    return ServerConfig()


@pytest.fixture
async def sdk(
    engine: FakeEngine, config: ServerConfig, serve_app: Any
) -> AsyncIterator[openai.AsyncOpenAI]:
    url = await serve_app(build_app(engine, config=config))
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
        yield client


async def chat(sdk: openai.AsyncOpenAI, **extra: Any) -> Any:
    return await sdk.chat.completions.create(model="fake-model", messages=HELLO, **extra)


# -- chat ---------------------------------------------------------------------------------------


async def test_the_message_carries_the_thinking_apart(sdk: openai.AsyncOpenAI) -> None:
    message = (await chat(sdk)).choices[0].message
    assert message.content == ANSWER
    assert message.reasoning_content == THOUGHT == message.reasoning  # type: ignore[attr-defined]


async def test_streamed_thinking_arrives_as_reasoning_deltas(sdk: openai.AsyncOpenAI) -> None:
    thoughts: dict[int, str] = {0: "", 1: ""}
    answers: dict[int, str] = {0: "", 1: ""}
    stream = await chat(sdk, stream=True, n=2)
    async for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            extra = delta.model_extra or {}
            thoughts[choice.index] += extra.get("reasoning_content") or ""
            assert extra.get("reasoning") == extra.get("reasoning_content")
            answers[choice.index] += delta.content or ""
            assert "<" not in (delta.content or "")  # no tag, not even a piece of one
    assert thoughts == {0: THOUGHT, 1: THOUGHT} and answers == {0: ANSWER, 1: ANSWER}


async def test_a_call_made_while_thinking_is_thinking(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    engine.outputs = [f"<think>Maybe {CALL}?</think>\nOK. {CALL}"]
    message = (await chat(sdk, tools=TOOLS)).choices[0].message
    assert message.reasoning_content == f"Maybe {CALL}?"  # type: ignore[attr-defined]
    [call] = message.tool_calls or []
    assert (call.function.name, message.content) == ("get_weather", "OK. ")
    [params] = engine.params.values()
    assert params.constraint is not None and params.constraint.thinking is not None


async def test_switches_budget_and_schema_reach_the_engine(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    engine.outputs = ['<think>x</think>{"a": 1}']
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    reply = await chat(
        sdk,
        response_format=format,
        reasoning_effort="low",
        extra_body={"thinking_token_budget": 64},
    )
    assert json.loads(reply.choices[0].message.content) == {"a": 1}
    [params] = engine.params.values()
    constraint = params.constraint
    assert constraint is not None and json.loads(constraint.spec) == schema
    assert constraint.thinking is not None and constraint.thinking.budget == 64
    assert engine.template_kwargs == [{"enable_thinking": True, "reasoning_effort": "low"}]


async def test_thinking_turned_off_by_the_request(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    engine.outputs = ["Straight away."]
    await chat(sdk, reasoning_effort="none")
    # The request's own chat_template_kwargs win over reasoning_effort.
    message = (
        (
            await chat(
                sdk,
                reasoning_effort="none",
                extra_body={"chat_template_kwargs": {"enable_thinking": True}},
            )
        )
        .choices[0]
        .message
    )
    assert engine.template_kwargs == [
        {"enable_thinking": False, "reasoning_effort": "none"},
        {"enable_thinking": True, "reasoning_effort": "none"},
    ]
    assert (message.content, message.reasoning_content) == ("Straight away.", None)  # type: ignore[attr-defined]


async def test_a_template_that_opens_the_block(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    engine.generation_prompt = "<think>\n"
    engine.outputs = [f"{THOUGHT}</think>{ANSWER}"]
    message = (await chat(sdk, extra_body={"thinking_token_budget": 5})).choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)  # type: ignore[attr-defined]
    [params] = engine.params.values()
    assert params.constraint is not None and params.constraint.thinking is not None
    assert params.constraint.thinking.inside and params.constraint.thinking.budget == 5


async def test_include_reasoning_false_leaves_it_out(sdk: openai.AsyncOpenAI) -> None:
    message = (await chat(sdk, extra_body={"include_reasoning": False})).choices[0].message
    assert message.content == ANSWER
    assert "reasoning_content" not in (message.model_extra or {})


async def test_a_model_that_does_not_think_has_no_reasoning_field(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    engine.chat_template = None
    message = (await chat(sdk, extra_body={"thinking_token_budget": 5})).choices[0].message
    assert message.content == OUTPUT  # nothing is split out, the budget has nothing to limit
    assert "reasoning_content" not in (message.model_extra or {})
    [params] = engine.params.values()
    assert params.constraint is None


@pytest.mark.parametrize("config", [ServerConfig(reasoning_parser="none")])
async def test_reasoning_parser_none(sdk: openai.AsyncOpenAI) -> None:
    message = (await chat(sdk)).choices[0].message
    assert message.content == OUTPUT


# -- Responses ----------------------------------------------------------------------------------


async def test_a_response_has_a_reasoning_item_before_its_message(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    response = await sdk.responses.create(
        model="fake-model", input="Hello", reasoning={"effort": "none"}
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert [c.text for c in reasoning.content or ()] == [THOUGHT]
    assert (message.type, response.output_text) == ("message", ANSWER)
    assert engine.template_kwargs == [{"enable_thinking": False, "reasoning_effort": "none"}]
    # The reasoning item goes back in a next request's input, and is not shown to the model.
    again = await sdk.responses.create(
        model="fake-model",
        input=[
            {"role": "user", "content": "Hello"},
            reasoning.model_dump(exclude_none=True),
            {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": "More?"},
        ],
    )
    assert again.output_text == ANSWER
    prompt = "".join(map(chr, list(engine.prompts.values())[-1]))
    assert THOUGHT not in prompt and "More?" in prompt


async def test_streamed_reasoning_events(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.responses.create(model="fake-model", input="Hello", stream=True)
    events = [event async for event in stream]
    for event in events:
        EVENTS.validate_python(event.model_dump())
    kinds = [e.type for e in events]
    first_text = kinds.index("response.output_text.delta")
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(kinds[4 : kinds.index("response.reasoning_text.done")]) == {
        "response.reasoning_text.delta"
    }
    assert kinds.index("response.output_item.done") < first_text
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert (thought, text) == (THOUGHT, ANSWER)
    final = events[-1].response
    SDKResponse.model_validate(final.model_dump())
    assert [item.type for item in final.output] == ["reasoning", "message"]
