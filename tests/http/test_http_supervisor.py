"""The engine supervisor with a scripted `open_engine`: restarts, backoff, giving up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from trio_llm.client.errors import EngineStartError
from trio_llm.config import EngineArgs
from trio_llm.http.runtime.supervisor import EngineGaveUpError, supervise_engine


class Engine:
    def __init__(self) -> None:
        self.dead = trio.Event()

    async def wait_dead(self) -> None:
        await self.dead.wait()


class Opener:
    """Hands out engines; `fail_next` makes the next start fail."""

    def __init__(self) -> None:
        self.engines: list[Engine] = []
        self.fail_next = False
        self.closed = 0
        self._opened = trio.lowlevel.ParkingLot()

    async def wait_engines(self, count: int) -> None:
        while len(self.engines) < count:
            await self._opened.park()

    @asynccontextmanager
    async def __call__(self, args: EngineArgs, **kwargs: Any) -> AsyncIterator[Engine]:
        if self.fail_next:
            self.fail_next = False
            raise EngineStartError("no")
        engine = Engine()
        self.engines.append(engine)
        self._opened.unpark_all()
        try:
            yield engine
        finally:
            self.closed += 1


async def test_restarts_a_dead_engine_with_growing_backoff(
    mock_clock: trio.testing.MockClock,
) -> None:
    mock_clock.autojump_threshold = 0
    opener = Opener()
    attached: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: supervise_engine(
                EngineArgs(), attached.append, open_engine=opener, backoff_s=1.0,
                max_restarts_per_minute=5, task_status=task_status,
            )
        )  # fmt: skip
        assert attached == [opener.engines[0]]
        start = trio.current_time()
        opener.engines[0].dead.set()
        await trio.testing.wait_all_tasks_blocked()
        assert attached[-1] is None  # the app is told at once
        await opener.wait_engines(2)
        assert trio.current_time() - start == pytest.approx(1.0)
        opener.engines[1].dead.set()
        opener.fail_next = True  # a failed restart counts as a death too
        await opener.wait_engines(3)
        assert trio.current_time() - start == pytest.approx(1 + 2 + 4)
        assert attached[-1] is opener.engines[2]
        nursery.cancel_scope.cancel()
    assert opener.closed == 3


async def test_gives_up_after_too_many_restarts(mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 0
    opener = Opener()

    async def kill_each() -> None:
        while True:
            for engine in opener.engines:
                engine.dead.set()
            await trio.sleep(0.01)

    with pytest.raises(ExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_each)
            await supervise_engine(
                EngineArgs(), lambda _: None, open_engine=opener, backoff_s=0.1,
                max_restarts_per_minute=1,
            )  # fmt: skip
    assert info.group_contains(EngineGaveUpError, match="2 times within a minute")
    assert len(opener.engines) == 2


async def test_no_restart_gives_up_at_first_death() -> None:
    opener = Opener()
    with pytest.raises(ExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: supervise_engine(
                    EngineArgs(), lambda _: None, open_engine=opener, restart=False,
                    task_status=task_status,
                )
            )  # fmt: skip
            opener.engines[0].dead.set()
    assert info.group_contains(EngineGaveUpError, match="restarts are off")
    assert len(opener.engines) == 1


async def test_first_start_failure_is_raised() -> None:
    opener = Opener()
    opener.fail_next = True
    with pytest.raises(EngineStartError):
        await supervise_engine(EngineArgs(), lambda _: None, open_engine=opener)
