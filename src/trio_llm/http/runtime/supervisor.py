"""The engine supervisor: the app's lifespan task that owns one engine and restarts it (the app
runs one per model replica, so a replica restarts alone while the others serve).

It opens the engine with `open_engine`, hands the client to the app, and waits for it to die.
When it dies, the app is told at once (so /health turns 503 and new requests get 503), the
dead engine's process and shared memory are released by leaving `open_engine`, and a new
engine is started after a backoff, unless restarts are off or too frequent, in which case the
supervisor gives up with `EngineGaveUpError`. Invariant: at most one engine per supervisor is
alive at a time, and the app never holds a client the supervisor has left. Logs and errors
name the engine by its label (`model[replica]`), start-up progress included.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

import trio

from trio_llm.client.engine_process import OnStage, log_stage
from trio_llm.client.errors import EngineDeadError, EngineStartError
from trio_llm.config import EngineArgs

if TYPE_CHECKING:
    from trio_llm.client import EngineClient

log = logging.getLogger(__name__)

OpenEngine = Callable[..., AbstractAsyncContextManager["EngineClient"]]
"""`open_engine(args, on_stage=...)`, or a test's stand-in."""


class EngineGaveUpError(RuntimeError):
    """The engine died and will not be restarted (restarts off, or too many per minute)."""


def _default_open_engine() -> OpenEngine:
    from trio_llm.client import open_engine

    return open_engine


async def supervise_engine(
    args: EngineArgs | Callable[[], EngineArgs],
    attach: Callable[[EngineClient | None], None],
    *,
    restart: bool = True,
    max_restarts_per_minute: int = 3,
    backoff_s: float = 0.5,
    open_engine: OpenEngine | None = None,
    label: str | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled. `task_status.started()` fires once the first engine is up; a first
    start that fails raises `EngineStartError` instead, naming `label` (the server must not
    come up). `args` may be a function, asked at each start (a restart takes the LoRA
    adapters served by then)."""
    open_engine = open_engine or _default_open_engine()
    args_now = args if callable(args) else lambda: args
    first = args_now()
    label = label or first.served_model_name or first.model
    on_stage: OnStage = log_stage(label)
    restarts: deque[float] = deque()
    started = False
    while True:
        try:
            async with open_engine(args_now(), on_stage=on_stage) as client:
                attach(client)
                if not started:
                    started = True
                    task_status.started()
                else:
                    log.warning("engine %s restarted", label)
                await client.wait_dead()
                attach(None)
                log.error("engine %s died; its in-flight requests fail", label)
        except EngineStartError as error:
            if not started:
                traceback = error.engine_traceback
                raise EngineStartError(f"{label}: {error}", engine_traceback=traceback) from None
            log.error("engine %s failed to restart: %s", label, error)
        except EngineDeadError as error:
            if not started:
                raise
            log.error("engine %s failure: %s", label, error)
        finally:
            attach(None)
        if not restart:
            raise EngineGaveUpError(
                f"engine {label} died and restarts are off (--no-engine-restart)"
            )
        now = trio.current_time()
        while restarts and now - restarts[0] > 60.0:
            restarts.popleft()
        if len(restarts) >= max_restarts_per_minute:
            raise EngineGaveUpError(
                f"engine {label} died {len(restarts) + 1} times within a minute; giving up"
            )
        delay = backoff_s * 2 ** len(restarts)
        restarts.append(now)
        log.warning("restarting engine %s in %.1f s", label, delay)
        await trio.sleep(delay)
