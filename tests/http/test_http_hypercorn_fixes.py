"""The Hypercorn fixes: applied where a server starts (never by building an app), and only to
the Hypercorn versions they were tested on. What each fix fixes is tested by the disconnect
tests (test_http_app.py, tests/reliability)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import trio
from http_fake_engine import FakeEngine
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import LifespanFailureError

from trio_llm.http import ServerConfig, build_app, hypercorn_fixes, server
from trio_llm.http.hypercorn_fixes import UnsupportedHypercornError, check_version

_PATCHED = (
    (H2Protocol, "handle"),
    (H2Protocol, "_handle_events"),
    (TCPServer, "run"),
    (TCPServer, "_close"),
)


def _methods() -> list[Callable[..., Any]]:
    return [getattr(cls, name) for cls, name in _PATCHED]


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process as if no fix had been applied yet; what the test patches is undone after."""
    for cls, name in _PATCHED:
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(hypercorn_fixes, "_applied", False)


@pytest.fixture
def untested_hypercorn(unpatched: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hypercorn_fixes, "_installed_version", lambda: "0.19.1")


def test_the_installed_hypercorn_is_a_tested_one() -> None:
    check_version(hypercorn_fixes._installed_version())


@pytest.mark.parametrize("version", ["0.17.3", "0.19.0", "0.19.0rc1", "1.0", "unknown"])
def test_versions_outside_the_tested_range_are_refused(version: str) -> None:
    with pytest.raises(UnsupportedHypercornError, match=r"hypercorn>=0\.18,<0\.19"):
        check_version(version)


@pytest.mark.parametrize("version", ["0.18", "0.18.0", "0.18.7"])
def test_versions_in_the_tested_range_pass(version: str) -> None:
    check_version(version)


@pytest.mark.usefixtures("untested_hypercorn")
def test_an_untested_hypercorn_is_not_patched() -> None:
    before = _methods()
    with pytest.raises(UnsupportedHypercornError, match=r"0\.19\.1"):
        hypercorn_fixes.apply()
    assert _methods() == before and not hypercorn_fixes.applied()


@pytest.mark.usefixtures("unpatched")
async def test_building_an_app_patches_nothing_and_serving_it_does(serve_app) -> None:  # type: ignore[no-untyped-def]
    before = _methods()
    app = build_app(FakeEngine())
    assert _methods() == before and not hypercorn_fixes.applied()
    await serve_app(app)  # Hypercorn runs the app's lifespan startup before it accepts
    assert hypercorn_fixes.applied()
    assert all(now is not then for now, then in zip(_methods(), before, strict=True))


@pytest.mark.usefixtures("untested_hypercorn")
async def test_an_app_under_an_untested_hypercorn_does_not_start() -> None:
    config = server.hypercorn_config(ServerConfig(port=0, shutdown_timeout=0.1))
    serve = partial(
        hypercorn_serve, build_app(FakeEngine()), config, shutdown_trigger=trio.sleep_forever
    )
    failure = pytest.RaisesExc(LifespanFailureError, match=r"0\.19\.1")
    with pytest.RaisesGroup(failure, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve)


@pytest.mark.usefixtures("untested_hypercorn")
async def test_serve_refuses_an_untested_hypercorn_before_the_engine_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_app(config: ServerConfig) -> None:
        raise AssertionError("the app (and its engine) were made before the version check")

    monkeypatch.setattr(server, "create_app", no_app)
    with pytest.raises(UnsupportedHypercornError):
        await server.serve(ServerConfig(port=0), handle_signals=False)
