"""Bad input never gets a 5xx: generated bodies against every POST route (fake engines, one
generating and one embedding, through Quart's in-process test client, so hundreds of requests
take a second or two). The same strategies run against the real engine in tests/reliability.
Derandomized unless TRIO_LLM_FUZZ says otherwise (fuzz_bodies.py); the bodies that ever failed
run first, every time."""

from __future__ import annotations

import contextlib
import json

import hypothesis.strategies as st
import pytest
import trio
from http_fake_engine import FakeEngine
from hypothesis import given
from quart_trio import QuartTrio

from fuzz_bodies import (
    PINNED,
    base_bodies,
    embedding_bodies,
    fuzz_settings,
    hostile_bodies,
    json_values,
    mutated_bodies,
    spliced_bodies,
)
from trio_llm.http import ServerConfig, build_app

UNPRODUCIBLE = frozenset({0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1, 0xF2})
"""The UTF-8 bytes the default model's vocabulary has no token for."""

_GENERATE = build_app(
    FakeEngine(max_model_len=4096, unproducible_bytes=UNPRODUCIBLE), config=ServerConfig()
)
_EMBED = build_app(FakeEngine(task="embed", name="fake-embed"), config=ServerConfig())
ROUTES: dict[str, tuple[QuartTrio, dict]] = {
    **{route: (_GENERATE, body) for route, body in base_bodies("fake-model").items()},
    **{f"embed:{route}": (_EMBED, body) for route, body in embedding_bodies("fake-embed").items()},
}


async def _post(route: str, raw: bytes) -> tuple[int, bytes]:
    """POST `raw` and read the response as it comes. (The test client's `post()` reads the body
    only after the app has finished, through a channel of 10 chunks: a streamed reply of more
    chunks than that would wait forever.)"""
    app, _ = ROUTES.get(route, (_GENERATE, {}))
    path = route.removeprefix("embed:")
    body = bytearray()
    headers = {"Content-Type": "application/json"}
    async with app.test_client().request(path, method="POST", headers=headers) as connection:
        await connection.send(raw)
        await connection.send_complete()
        with contextlib.suppress(trio.EndOfChannel):
            while True:
                body += await connection.receive()
    assert connection.status_code is not None
    return connection.status_code, bytes(body)


def _check_error(route: str, status: int, body: bytes) -> None:
    assert status < 500, body
    if status >= 400:
        error = json.loads(body)
        if route.startswith("/v1/messages"):  # Anthropic's shape
            assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        else:
            assert set(error["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("route", "raw"), PINNED, ids=[f"{r}-{i}" for i, (r, _) in enumerate(PINNED)]
)
async def test_bodies_that_failed_once_never_5xx(route: str, raw: bytes) -> None:
    _check_error(route, *await _post(route, raw))


@pytest.mark.parametrize("route", ROUTES)
@fuzz_settings(60)
@given(data=st.data())
async def test_mutated_fields_never_5xx(route: str, data: st.DataObject) -> None:
    body = data.draw(mutated_bodies(ROUTES[route][1]))
    _check_error(route, *await _post(route, json.dumps(body).encode()))


@pytest.mark.parametrize("route", ROUTES)
@fuzz_settings(60)
@given(data=st.data())
async def test_grammar_tool_and_template_fields_never_5xx(route: str, data: st.DataObject) -> None:
    body = data.draw(hostile_bodies(ROUTES[route][1], route.removeprefix("embed:")))
    _check_error(route, *await _post(route, json.dumps(body).encode()))


@pytest.mark.parametrize("route", ROUTES)
@fuzz_settings(40)
@given(data=st.data())
async def test_spliced_raw_values_never_5xx(route: str, data: st.DataObject) -> None:
    raw = data.draw(spliced_bodies(ROUTES[route][1]))
    _check_error(route, *await _post(route, raw))


@fuzz_settings(60)
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_arbitrary_bodies_never_5xx(raw: bytes) -> None:
    for route in ROUTES:
        status, body = await _post(route, raw)
        assert status < 500, (route, raw, body)
