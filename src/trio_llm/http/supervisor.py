"""The engine supervisor: the app's lifespan task that owns the engine and restarts it.

It opens the engine with `open_engine`, hands the client to the app, and waits for it to die.
When it dies, the app is told at once (so /health turns 503 and new requests get 503), the
dead engine's process and shared memory are released by leaving `open_engine`, and a new
engine is started after a backoff, unless restarts are off or too frequent, in which case the
supervisor gives up with `EngineGaveUpError`. Invariant: at most one engine is alive at a time,
and the app never holds a client the supervisor has left.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from trio_llm.client.errors import EngineDeadError, EngineStartError
from trio_llm.config import EngineArgs

if TYPE_CHECKING:
    from trio_llm.client import EngineClient

log = logging.getLogger(__name__)

OpenEngine = Callable[..., AbstractAsyncContextManager["EngineClient"]]


class EngineGaveUpError(RuntimeError):
    """The engine died and will not be restarted (restarts off, or too many per minute)."""


def _default_open_engine() -> OpenEngine:
    from trio_llm.client import open_engine

    return open_engine


async def supervise_engine(
    args: EngineArgs,
    attach: Callable[[EngineClient | None], None],
    *,
    restart: bool = True,
    max_restarts_per_minute: int = 3,
    backoff_s: float = 0.5,
    open_engine: OpenEngine | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled. `task_status.started()` fires once the first engine is up; a first
    start that fails raises `EngineStartError` instead (the server must not come up)."""
    open_engine = open_engine or _default_open_engine()
    kwargs: dict[str, Any] = msgspec.structs.asdict(args)
    restarts: deque[float] = deque()
    started = False
    while True:
        try:
            async with open_engine(**kwargs) as client:
                attach(client)
                if not started:
                    started = True
                    task_status.started()
                else:
                    log.warning("engine restarted")
                await client.wait_dead()
                attach(None)
                log.error("the engine died; in-flight requests fail")
        except (EngineDeadError, EngineStartError) as error:
            if not started:
                raise
            log.error("engine failure: %s", error)
        finally:
            attach(None)
        if not restart:
            raise EngineGaveUpError("the engine died and restarts are off (--no-engine-restart)")
        now = trio.current_time()
        while restarts and now - restarts[0] > 60.0:
            restarts.popleft()
        if len(restarts) >= max_restarts_per_minute:
            raise EngineGaveUpError(
                f"the engine died {len(restarts) + 1} times within a minute; giving up"
            )
        delay = backoff_s * 2 ** len(restarts)
        restarts.append(now)
        log.warning("restarting the engine in %.1f s", delay)
        await trio.sleep(delay)
