"""API keys with roles: only a `KEY:priority` key may ask for a more urgent `priority` (a 403
naming `priority` otherwise), anyone may ask for a later one, and a server without keys lets
every request ask for any; the flag's forms (repeated, comma-separated, the environment)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from http_fake_engine import FakeEngine

from http_server_process import run_small_server
from trio_llm.http import ServerConfig, build_app
from trio_llm.http.api_keys import PRIORITY_ROLE, parse_api_keys
from trio_llm.http.serve_flags import parse_serve_args

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
KEYS = "tenant, boss:priority"


def test_keys_and_roles_parse() -> None:
    keys = parse_api_keys("a, b:priority,,c")
    assert keys is not None
    assert keys.roles_of(["a"]) == frozenset()
    assert keys.roles_of(["b"]) == {PRIORITY_ROLE}
    assert keys.roles_of(["nope", "c"]) == frozenset()
    assert keys.roles_of(["nope", "b:priority"]) is None
    assert parse_api_keys(None) is None and parse_api_keys(" , ") is None
    with pytest.raises(ValueError, match="unknown role 'prioirty'"):
        parse_api_keys("k:prioirty")
    with pytest.raises(ValueError, match="empty key"):
        parse_api_keys(":priority")


def test_the_flag_repeats_and_the_environment_gives_a_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    repeated = parse_serve_args(["--api-key", "a", "--api-key", "b:priority"], {})
    assert repeated.api_key == "a,b:priority"
    assert repeated.api_keys is not None and repeated.api_keys.roles_of(["b"]) == {"priority"}
    # The command line replaces the environment's keys rather than adding to them.
    env = {"TRIO_LLM_API_KEY": "e:priority"}
    assert parse_serve_args([], env).api_key == "e:priority"
    assert parse_serve_args(["--api-key", "x"], env).api_key == "x"
    with pytest.raises(SystemExit):
        parse_serve_args(["--api-key", "k:admin"], {})
    assert "--api-key: unknown role 'admin'" in capsys.readouterr().err


@pytest.fixture
async def url(serve_app) -> str:  # type: ignore[no-untyped-def]
    return await serve_app(build_app(FakeEngine(), config=ServerConfig(api_key=KEYS)))


async def post(url: str, key: str, path: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}) as c:
        return await c.post(path, json=body)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"model": "fake-model", "prompt": "hi", "max_tokens": 3}),
        ("/v1/responses", {"model": "fake-model", "input": "hi", "max_output_tokens": 3}),
    ],
)
async def test_only_a_priority_key_may_jump_the_queue(
    url: str, path: str, body: dict[str, object]
) -> None:
    urgent = {**body, "priority": -5}
    refused = await post(url, "tenant", path, urgent)
    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert (error["param"], error["type"]) == ("priority", "invalid_request_error")
    assert "priority" in error["message"] and f"KEY:{PRIORITY_ROLE}" in error["message"]
    # The privileged key may; anyone may ask to run later or at the default.
    assert (await post(url, "boss", path, urgent)).status_code == 200
    assert (await post(url, "tenant", path, {**body, "priority": 7})).status_code == 200
    assert (await post(url, "tenant", path, body)).status_code == 200


async def test_anthropic_key_header_carries_the_role_too(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, headers={"x-api-key": "tenant"}) as c:
        refused = await c.post("/v1/chat/completions", json={**CHAT, "priority": -1})
    assert refused.status_code == 403


async def test_embeddings_check_the_role(serve_app) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine(task="embed")
    url = await serve_app(build_app(engine, config=ServerConfig(api_key=KEYS)))
    body = {"model": "fake-model", "input": "hi", "priority": -1}
    assert (await post(url, "tenant", "/v1/embeddings", body)).status_code == 403
    assert (await post(url, "boss", "/v1/embeddings", body)).status_code == 200


async def test_a_server_without_keys_has_no_tenants(serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(FakeEngine(), config=ServerConfig()))
    async with httpx.AsyncClient(base_url=url) as c:
        response = await c.post("/v1/chat/completions", json={**CHAT, "priority": -100})
    assert response.status_code == 200


def test_a_real_server_with_priority_scheduling(tiny_model_dir: Path) -> None:
    """End to end, on the engine that honours priorities: the tenant's urgent request is
    refused before it reaches the engine, the privileged one runs."""
    args = ("--scheduling-policy", "priority", "--api-key", KEYS, "--served-model-name", "tiny")
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "priority": -3}
    with run_small_server(tiny_model_dir, *args) as server:
        for key, status in (("tenant", 403), ("boss", 200), ("nobody", 401)):
            response = httpx.post(
                server.url + "/v1/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
            assert response.status_code == status, response.text
