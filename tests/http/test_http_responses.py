"""/v1/responses over a fake engine: the response object and every stream event validated
against the OpenAI SDK's own types, the event order and sequence numbers, the store (retrieve,
delete, store false, eviction, previous_response_id's history in the next prompt), the 400s
and 404s in OpenAI's shape, a failed stream, and the builder's function-call items and events
over a scripted parser. (A disconnect aborting the generation is
test_http_app.py's, for every streaming route.)"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import pydantic
import pytest
from http_fake_engine import FakeEngine
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent

from trio_llm.http import ServerConfig, build_app
from trio_llm.http.answer import AnswerReader
from trio_llm.http.responses.build import ResponsesStream, complete_response
from trio_llm.http.responses.protocol import FunctionCall, OutputMessage, ResponseObject
from trio_llm.outputs import CompletionOutput, RequestMetrics, RequestOutput

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(finish_reason="stop", max_model_len=4096)  # room for a tool block


@pytest.fixture
async def client(engine: FakeEngine, serve_app):  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(engine, config=ServerConfig(responses_store_size=3)))
    async with httpx.AsyncClient(base_url=url) as c:
        yield c


async def create(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/responses", json={"input": "hi", **body})
    assert response.status_code == 200, response.text
    SDKResponse.model_validate(response.json())
    return response.json()


def events_of(text: str) -> list[dict[str, Any]]:
    """Each event's data, checking the framing: an `event:` line naming the data's type,
    then its `data:` line; no [DONE]."""
    assert text.endswith("\n\n")
    events = []
    for block in text[:-2].split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[len("data: ") :])
        assert event["type"] == name[len("event: ") :]
        EVENTS.validate_python(event)
        events.append(event)
    return events


async def test_a_response_in_openais_shape(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = await create(
        client,
        instructions="be brief",
        max_output_tokens=3,
        temperature=0.5,
        metadata={"k": "v"},
        user="u1",
    )
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert (body["status"], body["incomplete_details"], body["error"]) == ("completed", None, None)
    [message] = body["output"]
    assert message["type"] == "message" and message["id"].startswith("msg_")
    assert (message["role"], message["status"]) == ("assistant", "completed")
    assert message["content"] == [
        {"type": "output_text", "text": "abc", "annotations": [], "logprobs": []}
    ]
    prompt = len("<system>be brief<user>hi<assistant>")
    assert body["usage"] == {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + 3,
    }
    echoed = {k: body[k] for k in ("instructions", "max_output_tokens", "metadata", "user")}
    assert echoed == {
        "instructions": "be brief",
        "max_output_tokens": 3,
        "metadata": {"k": "v"},
        "user": "u1",
    }
    assert (body["temperature"], body["store"], body["text"]) == (
        0.5,
        True,
        {"format": {"type": "text"}},
    )
    [params] = engine.params.values()
    assert (params.max_tokens, params.temperature) == (3, 0.5)


async def test_enable_response_messages_returns_the_raw_prompt_and_output(
    client: httpx.AsyncClient,
) -> None:
    """vLLM's extension, in its shape for a model without harmony; absent unless asked."""
    prompt = "<user>hi<assistant>"
    raw_in = {"message": prompt, "tokens": [ord(c) for c in prompt], "type": "raw_message_tokens"}
    raw_out = {"message": "abc", "tokens": [97, 98, 99], "type": "raw_message_tokens"}
    body = await create(client, max_output_tokens=3, enable_response_messages=True)
    assert (body["input_messages"], body["output_messages"]) == ([raw_in], [raw_out])
    stored = (await client.get(f"/v1/responses/{body['id']}")).json()
    assert stored["output_messages"] == [raw_out]
    plain = await create(client, max_output_tokens=3)
    assert "input_messages" not in plain and "output_messages" not in plain
    streamed = await client.post(
        "/v1/responses",
        json={
            "input": "hi",
            "stream": True,
            "max_output_tokens": 3,
            "enable_response_messages": True,
        },
    )
    last = events_of(streamed.text)[-1]["response"]
    assert (last["input_messages"], last["output_messages"]) == ([raw_in], [raw_out])


async def test_max_output_tokens_makes_it_incomplete(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.finish_reason = "length"
    body = await create(client, max_output_tokens=2)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert (await client.get(f"/v1/responses/{body['id']}")).json()["status"] == "incomplete"


async def test_the_stream_sends_openais_events_in_order(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 3}
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    created, final = events[0]["response"], events[-1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    assert created["id"] == final["id"]
    item_id = events[2]["item"]["id"]
    assert {e["item_id"] for e in events[3:9]} == {item_id}
    assert "".join(e["delta"] for e in events[4:7]) == "abc"
    assert events[7]["text"] == events[8]["part"]["text"] == "abc"
    assert events[9]["item"]["status"] == "completed"
    assert final["output"] == [events[9]["item"]]
    assert final["usage"]["output_tokens"] == 3
    stored = (await client.get(f"/v1/responses/{final['id']}")).json()
    assert stored == final


async def test_a_stream_cut_by_max_output_tokens_ends_incomplete(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.finish_reason = "length"
    response = await client.post(
        "/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 2}
    )
    last = events_of(response.text)[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_engine_death_mid_stream_is_response_failed(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.die_after_first = True
    response = await client.post("/v1/responses", json={"input": "hi", "stream": True})
    events = events_of(response.text)
    assert [e["type"] for e in events][-1] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["error"]["message"].endswith("(engine_dead)")
    assert failed["output"][0]["content"][0]["text"] == "a"
    missing = await client.get(f"/v1/responses/{failed['id']}")
    assert missing.status_code == 404  # a failed response is not stored


async def test_retrieve_delete_and_store_false(client: httpx.AsyncClient) -> None:
    body = await create(client)
    assert (await client.get(f"/v1/responses/{body['id']}")).json() == body
    deleted = await client.delete(f"/v1/responses/{body['id']}")
    assert deleted.json() == {"id": body["id"], "object": "response", "deleted": True}
    gone = await client.get(f"/v1/responses/{body['id']}")
    assert gone.status_code == 404
    assert gone.json() == {
        "error": {
            "message": f"Response with id '{body['id']}' not found.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert (await client.delete(f"/v1/responses/{body['id']}")).status_code == 404
    unstored = await create(client, store=False)
    assert unstored["store"] is False
    assert (await client.get(f"/v1/responses/{unstored['id']}")).status_code == 404


async def test_previous_response_id_puts_the_history_in_the_prompt(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    first = await create(client, input="one", instructions="A", max_output_tokens=2)
    second = await create(
        client,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "two"}]}],
        previous_response_id=first["id"],
        instructions="B",
        max_output_tokens=2,
    )
    third = await create(client, input="three", previous_response_id=second["id"])
    prompts = ["".join(map(chr, ids)) for ids in engine.prompts.values()]
    # The instructions are not carried over; every earlier turn is.
    assert prompts == [
        "<system>A<user>one<assistant>",
        "<system>B<user>one<assistant>ab<user>two<assistant>",
        "<user>one<assistant>ab<user>two<assistant>ab<user>three<assistant>",
    ]
    assert second["previous_response_id"] == first["id"]
    assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"]
    missing = await client.post(
        "/v1/responses", json={"input": "x", "previous_response_id": "resp_nope"}
    )
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert (error["param"], error["code"]) == (
        "previous_response_id",
        "previous_response_not_found",
    )
    assert error["message"] == "Previous response with id 'resp_nope' not found."


async def test_the_store_evicts_the_least_recently_used(client: httpx.AsyncClient) -> None:
    a, b, c = [await create(client, input=x) for x in "abc"]
    assert (await client.get(f"/v1/responses/{a['id']}")).status_code == 200  # a is recent now
    await create(client, input="d")  # capacity 3: b goes
    assert (await client.get(f"/v1/responses/{b['id']}")).status_code == 404
    for kept in (a, c):
        assert (await client.get(f"/v1/responses/{kept['id']}")).status_code == 200


async def test_text_format_json_schema_becomes_the_constraint(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    body = await create(client, text={"format": fmt})
    assert body["text"] == {"format": fmt}
    [params] = engine.params.values()
    assert params.constraint is not None and json.loads(params.constraint.spec) == schema
    await create(client, text={"format": {"type": "json_object"}})
    assert list(engine.params.values())[-1].constraint.kind.name == "JSON_OBJECT"


async def test_function_tools_reach_the_prompt_and_the_grammar(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = await create(client, tools=[WEATHER], tool_choice="required")
    assert body["tools"] == [{**WEATHER, "strict": None}] and body["tool_choice"] == "required"
    [(request_id, params)] = engine.params.items()
    assert params.constraint is not None and params.constraint.kind.name == "GRAMMAR"
    assert "weather" in params.constraint.spec and "<tool_call>" in params.constraint.spec
    prompt = "".join(map(chr, engine.prompts[request_id]))
    assert prompt.startswith("<system>") and "<tools>" in prompt and '"weather"' in prompt
    await create(client, tools=[WEATHER], tool_choice="none")
    assert list(engine.params.values())[-1].constraint is None


async def test_calls_and_their_outputs_in_the_input_become_the_history(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    call = {
        "type": "function_call",
        "call_id": "call_1",
        "name": "weather",
        "arguments": '{"city":"Paris"}',
    }
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}
    question = {"role": "user", "content": "Weather in Paris?"}
    await create(client, input=[question, call, output], tools=[WEATHER])
    prompt = "".join(map(chr, list(engine.prompts.values())[-1]))
    assert prompt.endswith(
        '<user>Weather in Paris?<assistant><tool_call>[{"name": "weather", "arguments": '
        '{"city": "Paris"}}]</tool_call><tool><tool_response>\nSunny\n</tool_response>'
        "<assistant>"
    )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "'web_search'"),
        (
            {"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]},
            "tools[0].type",
            "'file_search'",
        ),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type", "web_search_call"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
            "'input_file'",
        ),
        (
            {
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}
                ]
            },
            "input[0].content[0].image_url",
            "takes text only",
        ),
        ({"input": []}, "input", "empty"),
        ({"input": [{"type": []}]}, "input[0].type", "[]"),
        ({"input": [{"content": "x"}]}, "input[0]", "type"),
        ({"tool_choice": {"type": "function", "name": []}}, "tool_choice.name", "required"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "time"}},
            "tool_choice",
            "'time' is not among the tools",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools", "given twice"),
        (
            {"tools": [{**WEATHER, "parameters": {"type": 3}}], "tool_choice": "required"},
            "tools",
            "Invalid tools",
        ),
        ({"tools": [{**WEATHER, "name": "a b"}]}, "tools[0].name", "matching regex"),
        ({"tool_choice": "sometimes"}, "tool_choice", "sometimes"),
        ({"tool_choice": {"type": "mcp"}}, "tool_choice.type", "'mcp'"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "robot"),
        ({"background": True}, "background", "Background"),
        ({"conversation": "conv_1"}, "conversation", "Conversations"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name", "name"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 3}}}},
            "text.format.schema",
            "Invalid",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
        ({"temperature": -1}, "temperature", "temperature"),
    ],
)
async def test_what_it_cannot_do_is_a_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], param: str, words: str
) -> None:
    response = await client.post("/v1/responses", json={"input": "hi", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert words in error["message"]


async def test_openapi_shows_the_endpoints(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    assert {"post"} <= set(doc["paths"]["/v1/responses"])
    assert {"get", "delete"} <= set(doc["paths"]["/v1/responses/{response_id}"])
    assert "ResponsesRequest" in doc["components"]["schemas"]


# -- function calls in the builder, over a scripted parser ------------------------------------


@dataclass
class Delta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class Call:
    id: str
    name: str
    arguments: str


@dataclass
class ScriptedParser:
    """Gives back, for each text fed, the next (content, deltas) of its script."""

    script: list[tuple[str, list[Delta]]]
    calls: list[Call] = field(default_factory=list)
    content: str = ""

    def feed(self, text: str) -> tuple[str, list[Delta]]:
        return self.script.pop(0)

    def end(self) -> tuple[str, list[Delta]]:
        return self.script.pop(0) if self.script else ("", [])

    def finish(self) -> tuple[str, list[Call]]:
        return self.content, self.calls


def _output(text: str, finish: str | None = None) -> RequestOutput:
    o = CompletionOutput(0, text, [1] * len(text), finish_reason=finish)
    return RequestOutput("r", None, [1, 2], [o], finish is not None, RequestMetrics(0.0))


def _base() -> ResponseObject:
    return ResponseObject(id="resp_x", created_at=0, status="in_progress", model="m")


def test_a_streamed_message_then_two_calls() -> None:
    parser = ScriptedParser(
        [
            ("Let me look.", []),
            ("", [Delta(0, "call_1", "weather"), Delta(0, arguments='{"city":')]),
            ("", [Delta(0, arguments='"Paris"}'), Delta(1, "call_2", "time", "{}")]),
        ]
    )
    finished: list[ResponseObject] = []
    stream = ResponsesStream(_base(), finished.append, reader=AnswerReader(tools=parser))
    events = stream.begin()
    events += stream.feed(0, _output("a"))
    events += stream.feed(0, _output("b"))
    events += stream.feed(0, _output("c", "stop"))
    events += stream.end()
    bodies = [json.loads(msgspec.json.encode(e)) for e in events]
    for body in bodies:
        EVENTS.validate_python(body)
    assert [(b["type"], b.get("output_index")) for b in bodies] == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.content_part.added", 0),
        ("response.output_text.delta", 0),
        ("response.output_text.done", 0),
        ("response.content_part.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2),
        ("response.completed", None),
    ]
    assert [b["sequence_number"] for b in bodies] == list(range(len(bodies)))
    [response] = finished
    message, weather, clock = response.output
    assert isinstance(message, OutputMessage) and message.content[0].text == "Let me look."
    assert isinstance(weather, FunctionCall) and isinstance(clock, FunctionCall)
    assert (weather.call_id, weather.name, weather.arguments) == (
        "call_1",
        "weather",
        '{"city":"Paris"}',
    )
    assert (clock.call_id, clock.name, clock.arguments, clock.status) == (
        "call_2",
        "time",
        "{}",
        "completed",
    )
    assert bodies[11]["arguments"] == '{"city":"Paris"}' and bodies[11]["name"] == "weather"
    assert bodies[-1]["response"]["output"] == [
        b["item"] for b in bodies if b["type"].endswith("item.done")
    ]
    SDKResponse.model_validate(bodies[-1]["response"])


def test_a_call_cut_by_max_output_tokens_is_incomplete() -> None:
    parser = ScriptedParser([("", [Delta(0, "call_1", "weather", '{"ci')])])
    stream = ResponsesStream(_base(), lambda _: None, reader=AnswerReader(tools=parser))
    events = [*stream.begin(), *stream.feed(0, _output("x", "length")), *stream.end()]
    final = events[-1].response
    assert (final.status, final.output[0].status) == ("incomplete", "incomplete")
    assert final.output[0].arguments == '{"ci'


def test_a_complete_response_with_calls_only() -> None:
    parser = ScriptedParser([("", []), ("", [])], [Call("call_9", "weather", "{}")], "")
    response = complete_response(
        _base(),
        _output("<tool_call>...", "stop"),
        lambda _: None,
        reader=AnswerReader(tools=parser),
    )
    [call] = response.output
    assert isinstance(call, FunctionCall) and (call.call_id, call.status) == ("call_9", "completed")
    assert call.id.startswith("fc_")
    SDKResponse.model_validate(json.loads(msgspec.json.encode(response)))


CALL_TEXT = '<tool_call>[{"name": "weather", "arguments": {"city": "Paris"}}]</tool_call>'


async def test_a_scripted_call_end_to_end(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    """The model writes a call: a function_call item, streamed and not alike, which the next
    request answers through previous_response_id."""
    engine.outputs = [CALL_TEXT]
    body = await create(client, input="Weather in Paris?", tools=[WEATHER])
    [call] = body["output"]
    assert (call["type"], call["name"], call["status"]) == ("function_call", "weather", "completed")
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    streamed = await client.post(
        "/v1/responses", json={"input": "Weather in Paris?", "tools": [WEATHER], "stream": True}
    )
    events = events_of(streamed.text)
    [final] = events[-1]["response"]["output"]
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == final["arguments"] == call["arguments"]
    assert not any(e["type"].startswith("response.output_text") for e in events)
    engine.outputs = ["It is sunny."]
    answer = await create(
        client,
        previous_response_id=body["id"],
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny"}],
    )
    assert answer["output"][0]["content"][0]["text"] == "It is sunny."
    prompt = "".join(map(chr, list(engine.prompts.values())[-1]))
    assert prompt.endswith(
        f"<user>Weather in Paris?<assistant>{CALL_TEXT}"
        "<tool><tool_response>\nSunny\n</tool_response><assistant>"
    )
