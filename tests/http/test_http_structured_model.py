"""Structured outputs through the real server on the default model: the OpenAI SDK's
`chat.completions.parse`, every test schema as response_format (streamed and not), vLLM's
structured_outputs and guided_* fields, and the 400 for a constraint the engine cannot enforce."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import jiter
import openai
import pydantic
import pytest

from http_server_process import ServerProcess
from structured_cases import CHOICES, REGEXES, SCHEMAS, SchemaCase, assert_valid
from trio_llm.config import DEFAULT_MODEL

pytestmark = pytest.mark.slow

MAX_TOKENS = 160


@pytest.fixture
def server(default_server: ServerProcess) -> ServerProcess:
    return default_server


@pytest.fixture
def sdk(default_sdk: openai.OpenAI) -> openai.OpenAI:
    return default_sdk


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    population: int = pydantic.Field(ge=0, le=100_000_000)
    kind: Literal["capital", "town"]


def test_sdk_parse_returns_a_parsed_instance(sdk: openai.OpenAI) -> None:
    completion = sdk.chat.completions.parse(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        response_format=City,
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, City), message.content
    assert completion.choices[0].finish_reason == "stop"


def ask_schema(sdk: openai.OpenAI, case: SchemaCase, stream: bool) -> tuple[str, str | None]:
    fields = case.chat_body(DEFAULT_MODEL, MAX_TOKENS)
    if not stream:
        reply = sdk.chat.completions.create(**fields)  # type: ignore[call-overload]
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason
    text, finish = [], None
    for chunk in sdk.chat.completions.create(**fields, stream=True):  # type: ignore[call-overload]
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    return "".join(text), finish


@pytest.mark.parametrize("stream", [False, True])
def test_every_schema_parses_and_validates(sdk: openai.OpenAI, stream: bool) -> None:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda c: ask_schema(sdk, c, stream), SCHEMAS))
    for case, (text, finish) in zip(SCHEMAS, answers):
        assert finish == "stop", (case.name, text)
        assert_valid(case.schema, json.loads(text))


def post(server: ServerProcess, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": DEFAULT_MODEL, **body}, timeout=120)


def json_object_or_its_prefix(text: str, finish: str) -> bool:
    """json_object leaves the length open, and greedy text may repeat itself until max_tokens
    on some CPU classes and not others: a stopped answer is an object, a cut one a prefix of
    one (jiter reads a cut document and still refuses an invalid one)."""
    if finish == "stop":
        return isinstance(json.loads(text), dict)
    cut = jiter.from_json(text.encode(), partial_mode=True)
    return finish == "length" and isinstance(cut, dict)


def test_regex_choice_and_json_object_fields(server: ServerProcess) -> None:
    jobs = []
    for i, case in enumerate(REGEXES):
        field = {"structured_outputs": {"regex": case.pattern}} if i % 2 else {}
        field = field or {"guided_regex": case.pattern}
        jobs.append((case.prompt, field, lambda t, p=case.pattern: re.fullmatch(p, t)))
    for prompt, choices in CHOICES:
        jobs.append((prompt, {"guided_choice": choices}, lambda t, c=choices: t in c))
        jobs.append(
            (prompt, {"structured_outputs": {"choice": choices}}, lambda t, c=choices: t in c)
        )
    jobs.append(
        (
            "Describe a cat as JSON.",
            {"response_format": {"type": "json_object"}},
            json_object_or_its_prefix,
        )
    )

    def chat(job):  # type: ignore[no-untyped-def]
        prompt, field, _ = job
        messages = [{"role": "user", "content": prompt}]
        body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **field}
        return post(server, "/v1/chat/completions", body)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(chat, jobs))
    for (_, field, check), reply in zip(jobs, replies):
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        text = choice["message"]["content"]
        if check is json_object_or_its_prefix:
            assert check(text, choice["finish_reason"]), (field, text)
        else:
            assert check(text), (field, text)


def test_completions_with_n_choices_and_a_constraint(server: ServerProcess) -> None:
    reply = post(
        server,
        "/v1/completions",
        {
            "prompt": "A phone number: ",
            "guided_regex": r"[0-9]{3}-[0-9]{4}",
            "n": 3,
            "temperature": 1.0,
            "seed": 1,
            "max_tokens": 20,
        },
    )
    assert reply.status_code == 200, reply.text
    texts = [c["text"] for c in reply.json()["choices"]]
    assert len(texts) == 3 and all(re.fullmatch(r"[0-9]{3}-[0-9]{4}", t) for t in texts)


def test_a_constraint_the_engine_cannot_enforce_is_a_400(server: ServerProcess) -> None:
    reply = post(
        server,
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "guided_json": {"type": "strin"}},
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "guided_json" and "strin" in error["message"]
    assert server.wait_idle()["trio_llm_num_requests_running"] == 0
