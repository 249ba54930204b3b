"""Bad input on Ollama's routes never gets a 5xx, and every refusal is Ollama's
`{"error": "..."}`: generated bodies (arbitrary JSON in Ollama's fields and options, JSON
schemas of every kind as `format`, arbitrary bytes) against /api/chat, /api/generate,
/api/embed, /api/embeddings and /api/show on fake engines, through Quart's in-process test
client. Derandomized unless TRIO_LLM_FUZZ says otherwise (fuzz_bodies.py)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import hypothesis.strategies as st
import pytest
import trio
from http_fake_engine import FakeEngine
from hypothesis import given
from quart_trio import QuartTrio

from fuzz_bodies import fuzz_settings, json_values, schemas
from trio_llm.http import ServerConfig, build_app

_GENERATE = build_app(FakeEngine(max_model_len=4096), config=ServerConfig())
_EMBED = build_app(FakeEngine(task="embed", name="fake-embed"), config=ServerConfig())
HELLO = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, tuple[QuartTrio, dict[str, Any]]] = {
    "/api/chat": (_GENERATE, {"model": "fake-model", "messages": HELLO}),
    "/api/generate": (_GENERATE, {"model": "fake-model", "prompt": "hi"}),
    "/api/show": (_GENERATE, {"model": "fake-model"}),
    "/api/embed": (_EMBED, {"model": "fake-embed", "input": ["a", "b"]}),
    "/api/embeddings": (_EMBED, {"model": "fake-embed", "prompt": "a"}),
}
FIELDS = [
    "model", "messages", "prompt", "system", "template", "raw", "suffix", "context", "images",
    "format", "options", "think", "tools", "keep_alive", "logprobs", "top_logprobs", "input",
    "truncate", "dimensions", "name",
]  # fmt: skip
OPTIONS = [
    "num_ctx", "num_predict", "temperature", "top_k", "top_p", "min_p", "typical_p", "tfs_z",
    "seed", "stop", "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty",
    "mirostat", "mirostat_tau", "num_thread", "num_gpu", "num_keep", "penalize_newline",
]  # fmt: skip


async def _post(route: str, raw: bytes) -> tuple[int, bytes]:
    app, _ = ROUTES[route]
    body = bytearray()
    async with app.test_client().request(route, method="POST") as connection:
        await connection.send(raw)
        await connection.send_complete()
        with contextlib.suppress(trio.EndOfChannel):
            while True:
                body += await connection.receive()
    assert connection.status_code is not None
    return connection.status_code, bytes(body)


def _check(status: int, body: bytes) -> None:
    assert status < 500, body
    if status >= 400:
        error = json.loads(body)
        assert list(error) == ["error"] and isinstance(error["error"], str), body


def _short(body: dict[str, Any]) -> dict[str, Any]:
    """Not streamed (a streamed 200 says nothing more), two tokens at most."""
    options = body.get("options")
    if isinstance(options, dict) and "num_predict" not in options:
        body["options"] = {**options, "num_predict": 2}
    elif options is None:
        body["options"] = {"num_predict": 2}
    return {**body, "stream": False}


@pytest.mark.parametrize("route", ROUTES)
@fuzz_settings(60)
@given(data=st.data())
async def test_mutated_fields_never_5xx(route: str, data: st.DataObject) -> None:
    changes = data.draw(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4))
    body = _short({**ROUTES[route][1], **changes})
    _check(*await _post(route, json.dumps(body).encode()))


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
@fuzz_settings(60)
@given(data=st.data())
async def test_options_and_formats_never_5xx(route: str, data: st.DataObject) -> None:
    options = data.draw(st.dictionaries(st.sampled_from(OPTIONS), json_values, max_size=4))
    fields: dict[str, Any] = {"options": options}
    if data.draw(st.booleans()):
        fields["format"] = data.draw(schemas)
    body = _short({**ROUTES[route][1], **fields})
    _check(*await _post(route, json.dumps(body).encode()))


@fuzz_settings(60)
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_arbitrary_bodies_never_5xx(raw: bytes) -> None:
    for route in ROUTES:
        _check(*await _post(route, raw))
