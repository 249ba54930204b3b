"""What happens when an app starts and stops serving, and the process's logging.

- Every app applies the Hypercorn fixes (hypercorn_fixes.py) when it starts serving, before the
  first connection, which also covers `hypercorn 'trio_llm.http:create_app()'`; building an app
  changes nothing in the process.
- An app from `create_app` owns its engine: its lifespan runs the supervisor (supervisor.py),
  which starts the engine before the app takes requests, restarts it if it dies, and stops it
  (at most 60 s) when the app stops serving.
"""

from __future__ import annotations

import contextlib
import logging

import trio
from quart_trio import QuartTrio

from trio_llm.http import hypercorn_fixes
from trio_llm.http.state import AppState
from trio_llm.http.supervisor import EngineGaveUpError, supervise_engine

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


def own_engine(app: QuartTrio, state: AppState) -> None:
    """Run the engine's supervisor for as long as `app` serves."""
    scope = trio.CancelScope()
    done = trio.Event()

    async def run_supervisor(task_status: trio.TaskStatus[None]) -> None:
        try:
            with scope:
                await supervise_engine(
                    state.config.engine,
                    state.attach,
                    restart=state.config.restart_engine,
                    max_restarts_per_minute=state.config.max_restarts_per_minute,
                    task_status=task_status,
                )
        except EngineGaveUpError as error:
            log.critical("%s", error)
            state.engine_failed.set()
        finally:
            done.set()

    @app.before_serving
    async def start_engine() -> None:
        await app.nursery.start(run_supervisor)

    @app.after_serving
    async def stop_engine() -> None:
        scope.cancel()
        with contextlib.suppress(trio.TooSlowError):
            with trio.fail_after(60):
                await done.wait()
