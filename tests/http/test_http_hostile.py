"""Hostile bodies over a fake engine on loopback: what cannot be served is a 4xx naming its
field on every endpoint that takes it (never a 5xx), a body over the size limit gets a 413 the
client can read over HTTP/1.1 and HTTP/2, and the wire keeps the shapes vLLM's clients read
(prompt_logprobs, /invocations, embeddings of a conversation)."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import trio
from http_fake_engine import FakeEngine

from trio_llm.client.errors import EngineRequestError, UnservableRequestError
from trio_llm.http import ServerConfig, build_app

HI = [{"role": "user", "content": "hi"}]
ASTRAL = "\U000bff35"
"""F2 BF BC B5 in UTF-8: the default model has no token for the byte F2."""
LIMIT = 1 << 20


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192, unproducible_bytes=frozenset({0xF2}))


@pytest.fixture
async def url(engine: FakeEngine, serve_app) -> str:  # type: ignore[no-untyped-def]
    return await serve_app(build_app(engine, config=ServerConfig(max_body_size=LIMIT)))


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        yield c


@pytest.fixture
async def sdk(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def _schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(parameters: Any) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


DEEP: Any = {}
for _ in range(200):
    DEEP = {"type": "object", "properties": {"a": DEEP}}

UNSERVABLE = [
    ("/v1/completions", {"prompt": "Hi", "guided_regex": ASTRAL}, "guided_regex", "byte F2"),
    (
        "/v1/chat/completions",
        {"messages": HI, "response_format": _schema({"enum": [ASTRAL]})},
        "response_format.json_schema.schema",
        "byte F2",
    ),
    (
        "/v1/chat/completions",
        {"messages": HI, "structured_outputs": {"choice": [f"c{i}" + ASTRAL for i in range(3000)]}},
        "structured_outputs.choice",
        "byte F2",
    ),
    (
        "/v1/responses",
        {"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x",
                                            "schema": {"const": ASTRAL}}}},
        "text.format.schema",
        "byte F2",
    ),
    (
        "/v1/chat/completions",
        {"messages": HI, "tools": _tool({"type": "object", "properties": {"a": {"const": ASTRAL}},
                                         "required": ["a"]}),
         "tool_choice": "required"},
        "tools",
        "byte F2",
    ),
    (
        "/v1/responses",
        {"input": "Hi", "tools": [{"type": "function", "name": "f",
                                   "parameters": {"anyOf": [{"required": [f"k{i}"]}
                                                            for i in range(2100)]}}],
         "tool_choice": "required"},
        "tools",
        "too complex",
    ),
    ("/v1/chat/completions", {"messages": HI, "response_format": _schema(DEEP)},
     "response_format.json_schema.schema", "at most 64"),
    ("/v1/chat/completions", {"messages": HI, "tools": _tool(DEEP)}, "tools", "at most 64"),
    ("/v1/completions", {"prompt": "Hi", "guided_json": DEEP}, "guided_json", "at most 64"),
    ("/v1/completions", {"prompt": "Hi", "guided_regex": "(?<=a)b"}, "guided_regex",
     "look-around"),
    ("/invocations", {"prompt": "Hi", "guided_regex": ASTRAL}, "guided_regex", "byte F2"),
]  # fmt: skip


@pytest.mark.parametrize(("route", "body", "param", "words"), UNSERVABLE)
async def test_what_cannot_be_served_is_a_400_naming_its_field_on_every_endpoint(
    client: httpx.AsyncClient,
    engine: FakeEngine,
    route: str,
    body: dict[str, Any],
    param: str,
    words: str,
) -> None:
    """The issue's own body first: a regex of U+BFF35 reached the engine, whose mask let a
    token through that the grammar refused: a 500 with llguidance's parser state in it."""
    for stream in (False, True):
        reply = await client.post(route, json={**body, "max_tokens": 4, "stream": stream})
        error = reply.json()["error"]
        assert (reply.status_code, error["param"]) == (400, param), error
        assert words in error["message"] and "<state>" not in error["message"]
    assert not engine.prompts  # nothing reached the engine


async def test_the_issue_body_as_curl_sends_it(client: httpx.AsyncClient) -> None:
    raw = b'{"prompt": "Hi", "guided_regex": "\\udabf\\udf35"}'
    headers = {"Content-Type": "application/json"}
    reply = await client.post("/v1/completions", content=raw, headers=headers)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "guided_regex"


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/completions", {"prompt": "Hi", "guided_regex": "a+"}, "guided_regex"),
        ("/v1/chat/completions", {"messages": HI, "tools": _tool({"type": "object"}),
                                  "tool_choice": "required"}, "tools"),
        ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_object"}}},
         "text.format"),
        ("/v1/completions", {"prompt": "Hi", "allowed_token_ids": [5]}, "allowed_token_ids"),
    ],
)  # fmt: skip
async def test_an_engine_dead_end_is_a_400_naming_the_field(
    client: httpx.AsyncClient, engine: FakeEngine, route: str, body: dict[str, Any], param: str
) -> None:
    """What the engine finds only while generating (nothing the constraint allows can be
    written next) is still the request's fault: a 400, naming the field the constraint came
    from; an engine failure of its own stays a 500."""
    fault = "constraint" if param != "allowed_token_ids" else param
    engine.fail_with = UnservableRequestError("nothing allowed can be written", param=fault)
    reply = await client.post(route, json={**body, "max_tokens": 4})
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, param)
    engine.fail_with = EngineRequestError("the output left its grammar")
    reply = await client.post(route, json={**body, "max_tokens": 4})
    assert reply.status_code == 500


async def test_auto_tools_beside_a_grammar_constraint_are_refused(
    client: httpx.AsyncClient,
) -> None:
    body = {"messages": HI, "tools": _tool({"type": "object"}), "guided_grammar": 'start: "x"'}
    reply = await client.post("/v1/chat/completions", json=body)
    assert (reply.status_code, reply.json()["error"]["param"]) == (400, "tool_choice")


# -- 413 ----------------------------------------------------------------------------------------

BIG = json.dumps({"model": "fake-model", "prompt": "x" * (8 * LIMIT)}).encode()


def _raw_http1(port: int, body: bytes) -> tuple[bytes, bytes]:
    """POST `body` a piece at a time, as a client that reads nothing before it has sent all;
    then the first response, and what a second request on the same connection gets."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        s.sendall(head)
        for i in range(0, len(body), 1 << 16):
            s.sendall(body[i : i + (1 << 16)])  # before: EPIPE once the 413 had gone out
        first = _read_response(s)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        return first, _read_response(s)


def _read_response(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    lengths = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
    length = int(lengths[0].split(b":")[1])
    while len(rest) < length:
        rest += s.recv(65536)
    return head + b"\r\n\r\n" + rest[:length]


async def test_a_body_over_the_limit_gets_a_413_the_client_reads(url: str) -> None:
    port = int(url.rsplit(":", 1)[1])
    first, second = await trio.to_thread.run_sync(_raw_http1, port, BIG)
    assert first.startswith(b"HTTP/1.1 413")
    assert b"larger than the limit" in first
    assert second.startswith(b"HTTP/1.1 200")  # the connection was kept, the body dropped
    for kwargs in ({}, {"http1": False, "http2": True}):  # HTTP/1.1, and h2c
        async with httpx.AsyncClient(base_url=url, timeout=30, **kwargs) as c:
            reply = await c.post(
                "/v1/completions", content=BIG, headers={"Content-Type": "application/json"}
            )
            assert reply.status_code == 413, kwargs
            assert reply.json()["error"]["message"].startswith("The request body is larger")
            assert (await c.get("/health")).status_code == 200


# -- the wire -----------------------------------------------------------------------------------


async def test_prompt_logprobs_is_always_there(client: httpx.AsyncClient) -> None:
    chat = await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
    assert chat.json()["prompt_logprobs"] is None and chat.json()["service_tier"] is None
    text = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert text.json()["choices"][0]["prompt_logprobs"] is None


def _same_but_ids(reply: httpx.Response) -> dict[str, Any]:
    body = reply.json()
    assert reply.status_code == 200, body
    return {k: v for k, v in body.items() if k not in ("id", "created")}


async def test_invocations_answers_with_the_endpoints_body(client: httpx.AsyncClient) -> None:
    for route, body in (
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "logprobs": True}),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "echo": True}),
    ):
        direct = _same_but_ids(await client.post(route, json=body))
        assert _same_but_ids(await client.post("/invocations", json=body)) == direct


async def test_embeddings_of_a_conversation(serve_app) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine(task="embed", name="fake-embed")
    url = await serve_app(build_app(engine, config=ServerConfig()))
    async with httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/v1/embeddings", json={"messages": HI})
        assert reply.status_code == 200, reply.text
        [data] = reply.json()["data"]
        rendered = [float(ord(c)) for c in "<user>hi<assistant>"[:4]]
        assert data["embedding"] == rendered  # the fake's embedding: the first 4 token ids
        both = await client.post("/v1/embeddings", json={"messages": HI, "input": "x"})
        assert (both.status_code, both.json()["error"]["param"]) == (400, "input")
        keys = (await client.post("/invocations", json={"input": "x"})).json().keys()
        # Exactly the routed endpoint's keys, as vLLM's test checks; an SDK's model_dump()
        # adds its own optional fields (ChatCompletion's metadata, moderation), not the wire's.
        assert keys == (await client.post("/v1/embeddings", json={"input": "x"})).json().keys()
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x") as sdk:
            assert (
                await sdk.embeddings.create(input="x", model="fake-embed")
            ).model_dump().keys() <= keys
