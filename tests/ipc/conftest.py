"""Fixtures of the ring tests, and AnyIO tests that really run on both backends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trio_llm.ipc import ShmRing


@pytest.hookimpl(trylast=True)  # after pytest-trio's automark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # trio_mode marks every async test for pytest-trio, which would then run an anyio-marked
    # test under Trio whatever its anyio_backend says. Give those tests back to AnyIO.
    for item in items:
        if item.get_closest_marker("anyio") is not None:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "trio"]


@pytest.fixture(params=["trio", "asyncio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["membarrier", "lock"])
def fence(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def ring(fence: str) -> Iterator[ShmRing]:
    with ShmRing.create(256, fence=fence) as r:  # type: ignore[arg-type]
        yield r
