"""Bad input never gets a 5xx: generated bodies against every POST route (fake engine,
Quart's in-process test client, so hundreds of requests take a second or two). The same
strategies run against the real engine in tests/reliability."""

from __future__ import annotations

import contextlib
import json

import hypothesis.strategies as st
import pytest
import trio
from http_fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings

from fuzz_bodies import base_bodies, json_values, mutated_bodies, spliced_bodies
from trio_llm.http import ServerConfig, build_app

ROUTES = base_bodies("fake-model")

_APP = build_app(FakeEngine(max_model_len=64), config=ServerConfig())


async def _post(route: str, raw: bytes) -> tuple[int, bytes]:
    """POST `raw` and read the response as it comes. (The test client's `post()` reads the body
    only after the app has finished, through a channel of 10 chunks: a streamed reply of more
    chunks than that would wait forever.)"""
    body = bytearray()
    headers = {"Content-Type": "application/json"}
    async with _APP.test_client().request(route, method="POST", headers=headers) as connection:
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


@pytest.mark.parametrize("route", ROUTES)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
async def test_mutated_fields_never_5xx(route: str, data: st.DataObject) -> None:
    body = data.draw(mutated_bodies(ROUTES[route]))
    _check_error(route, *await _post(route, json.dumps(body).encode()))


@pytest.mark.parametrize("route", ROUTES)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
async def test_spliced_raw_values_never_5xx(route: str, data: st.DataObject) -> None:
    raw = data.draw(spliced_bodies(ROUTES[route]))
    _check_error(route, *await _post(route, raw))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_arbitrary_bodies_never_5xx(raw: bytes) -> None:
    for route in ROUTES:
        status, body = await _post(route, raw)
        assert status < 500, (route, raw, body)
