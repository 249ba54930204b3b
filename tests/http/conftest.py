"""Fixtures for the HTTP tests: an in-process Hypercorn on a loopback port (real sockets)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio
from hypercorn.trio import serve as hypercorn_serve
from quart_trio import QuartTrio

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
