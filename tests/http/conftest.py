"""Fixtures for the HTTP tests: an in-process Hypercorn on a loopback port (real sockets), and
the one real server on the default model that the modules checking real text share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from functools import partial

import openai
import pytest
import trio
from hypercorn.trio import serve as hypercorn_serve
from quart_trio import QuartTrio

from http_server_process import ServerProcess, run_server
from trio_llm.http.config import ServerConfig
from trio_llm.http.server import hypercorn_config

ServeApp = Callable[..., Awaitable[str]]


@pytest.fixture
def serve_app(nursery: trio.Nursery) -> ServeApp:
    """Serve `app` on 127.0.0.1 (port chosen by the OS) until the test ends; returns the URL."""

    async def serve(
        app: QuartTrio, *, certfile: str | None = None, keyfile: str | None = None
    ) -> str:
        config = hypercorn_config(
            ServerConfig(port=0, certfile=certfile, keyfile=keyfile, shutdown_timeout=0.1)
        )
        [url] = await nursery.start(
            partial(hypercorn_serve, app, config, shutdown_trigger=trio.sleep_forever)
        )
        return url

    return serve


@pytest.fixture(scope="session")
def default_server(default_model: object) -> Iterator[ServerProcess]:
    """The default model behind one real server, shared by the test modules that need it
    (structured outputs, tool calling, the Responses API, the Agents SDK): one engine start
    for all of them, stopped (and checked to exit cleanly) when the session ends."""
    with run_server("--kv-cache-memory", "64MiB", "--max-model-len", "2048") as server:
        yield server


@pytest.fixture(scope="session")
def default_sdk(default_server: ServerProcess) -> Iterator[openai.OpenAI]:
    """The OpenAI SDK on `default_server`."""
    url = default_server.url + "/v1"
    with openai.OpenAI(base_url=url, api_key="none", max_retries=0) as client:
        yield client
