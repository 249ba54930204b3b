"""What happens when an app starts and stops serving, and the process's logging.

- Every app applies the Hypercorn fixes (hypercorn_fixes.py) when it starts serving, before the
  first connection, which also covers `hypercorn 'trio_llm.http:create_app()'`; building an app
  changes nothing in the process.
- An app from `create_app` owns its engines: its lifespan runs one supervisor (supervisor.py)
  per engine, each model's each replica, which start them all at once before the app takes
  requests, restart one that dies, and stop them (at most 60 s) when the app stops serving.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from functools import partial

import trio
from quart_trio import QuartTrio

from trio_llm.client.engine_process import replica_label
from trio_llm.client.errors import start_error_in
from trio_llm.config import EngineArgs
from trio_llm.http import hypercorn_fixes
from trio_llm.http.model_specs import engine_args
from trio_llm.http.runtime.state import AppState
from trio_llm.http.runtime.supervisor import EngineGaveUpError, supervise_engine

log = logging.getLogger(__name__)

_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str, *, root: bool = True) -> None:
    """Log to stderr at `level`, unless the process already set logging up. `root=False`
    configures only trio-llm's loggers (under a Hypercorn that logs its own lines)."""
    if logging.getLogger().handlers:
        return
    if root:
        logging.basicConfig(level=level.upper(), format=_LOG_FORMAT)
        return
    logger = logging.getLogger("trio_llm")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(level.upper())


def fix_hypercorn_when_serving(app: QuartTrio) -> None:
    """Apply the fixes in `app`'s lifespan startup, which Hypercorn runs before it accepts the
    first connection; an untested Hypercorn fails the startup (the server does not start)."""

    @app.before_serving
    async def fix_hypercorn() -> None:
        hypercorn_fixes.apply()


def freeze_the_heap() -> None:
    """Leave what start-up built (modules, tokenizers: some 300,000 objects) out of the
    garbage collector's full passes: one of those, which any allocation may trigger, held the
    event loop for 0.4 s, stalling every stream; after this it visits what requests create."""
    gc.collect()
    gc.freeze()


def own_engines(app: QuartTrio, state: AppState) -> None:
    """Run one supervisor per engine (each model's each replica) for as long as `app` serves.

    All engines start at once, each logging its progress; the app takes requests once every
    one is up, and one that fails to start fails the start with its own error (the others are
    stopped). A replica that dies restarts alone; one that gives up is retired, and the server
    ends only when a model has no replica left."""
    config = state.config
    scopes: list[trio.CancelScope] = []
    done = trio.Event()
    running = 0

    def cancel_all() -> None:
        for scope in scopes:
            scope.cancel()

    async def run_supervisor(
        group: int, index: int, args: EngineArgs, task_status: trio.TaskStatus[None]
    ) -> None:
        nonlocal running
        running += 1
        scope = trio.CancelScope()
        scopes.append(scope)
        try:
            with scope:
                await supervise_engine(
                    partial(state.engine_args, group, args),
                    partial(state.attach, group, index),
                    restart=config.restart_engine,
                    max_restarts_per_minute=config.max_restarts_per_minute,
                    label=replica_label(args, index),
                    task_status=task_status,
                )
        except EngineGaveUpError as error:
            log.critical("%s; replica out of rotation", error)
            state.retire(group, index)
        finally:
            running -= 1
            if not running:
                done.set()

    @app.before_serving
    async def start_engines() -> None:
        try:
            async with trio.open_nursery() as starters:
                engines = [
                    (group, index, spec)
                    for group, spec in enumerate(config.model_specs)
                    for index in range(spec.replicas)
                ]
                for engine_index, (group, index, spec) in enumerate(engines):
                    args = engine_args(spec, index, engine_index)
                    starters.start_soon(
                        partial(app.nursery.start, run_supervisor, group, index, args)
                    )
        except BaseExceptionGroup as group:
            cancel_all()
            error = start_error_in(group)
            if error is None:
                raise
            raise error from None
        freeze_the_heap()

    @app.after_serving
    async def stop_engines() -> None:
        cancel_all()
        with contextlib.suppress(trio.TooSlowError):
            with trio.fail_after(60):
                await done.wait()
