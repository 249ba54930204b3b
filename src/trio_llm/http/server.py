"""`trio-llm serve`: the app under Hypercorn's trio worker, with signals and graceful shutdown.

Owns the process-level lifecycle: Hypercorn's config (bind, TLS with ALPN h2 and http/1.1;
cleartext HTTP/2 with prior knowledge works on a plain port as Hypercorn detects the h2
preface), logging, and shutdown. On SIGINT/SIGTERM the server stops accepting, in-flight
requests get --shutdown-timeout seconds to finish, the rest are cancelled (which aborts them
in the engine), then the app's lifespan stops the engine. A second signal cancels at once.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from functools import partial

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.utils import LifespanFailureError

from trio_llm.http import hypercorn_fixes
from trio_llm.http.app import create_app
from trio_llm.http.config import ServerConfig
from trio_llm.http.runtime.lifespan import setup_logging
from trio_llm.http.runtime.state import AppState, app_state

log = logging.getLogger("trio_llm.server")


def hypercorn_config(config: ServerConfig) -> HypercornConfig:
    hc = HypercornConfig()
    host = f"[{config.host}]" if ":" in config.host else config.host
    hc.bind = [f"{host}:{config.port}"]
    hc.certfile = config.certfile
    hc.keyfile = config.keyfile
    hc.alpn_protocols = ["h2", "http/1.1"]
    hc.graceful_timeout = config.shutdown_timeout
    # The engines start inside the lifespan, each within its own `startup_timeout`; Hypercorn's
    # own 60 s default cut off a first start that built the kernels on 2 cores (found starting a
    # checkout whose kernels were not yet built).
    hc.startup_timeout = sum(s.args.startup_timeout * s.replicas for s in config.model_specs)
    hc.accesslog = logging.getLogger("trio_llm.access")
    hc.access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(D)sus'
    hc.errorlog = logging.getLogger("hypercorn.error")
    return hc


async def serve(
    config: ServerConfig,
    *,
    handle_signals: bool = True,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> int:
    """Serve until a signal (or until the engine dies for good); the exit status is returned.

    `task_status.started` receives the bound URLs, e.g. ['http://127.0.0.1:8000'].
    An untested Hypercorn raises `UnsupportedHypercornError` here, before the engine starts."""
    hypercorn_fixes.apply()
    app = create_app(config)
    state = app_state(app)
    shutdown = trio.Event()
    signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()

    receiver = trio.open_signal_receiver(*signals) if signals else contextlib.nullcontext(None)
    with receiver as received:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                assert received is not None
                async for signum in received:
                    name = signal.Signals(signum).name
                    if shutdown.is_set():
                        log.warning("%s again: aborting in-flight requests now", name)
                        nursery.cancel_scope.cancel()
                        return
                    log.info(
                        "%s: no new connections; in-flight requests have %.0f s to finish",
                        name,
                        config.shutdown_timeout,
                    )
                    shutdown.set()

            async def watch_engine() -> None:
                await state.engine_failed.wait()
                shutdown.set()

            async def run_hypercorn(task_status: trio.TaskStatus[list[str]]) -> None:
                await hypercorn_serve(
                    app,
                    hypercorn_config(config),
                    shutdown_trigger=shutdown.wait,
                    task_status=task_status,
                )
                nursery.cancel_scope.cancel()

            if signals:
                nursery.start_soon(watch_signals)
            nursery.start_soon(watch_engine)
            try:
                binds = await nursery.start(run_hypercorn)
            except LifespanFailureError as error:
                log.error("could not start: %s", error)
                nursery.cancel_scope.cancel()
                return 1
            _log_serving(state, config, binds)
            task_status.started(binds)
    if state.engine_failed.is_set():
        log.error("exiting: every replica of a model died and was not restarted")
        return 1
    log.info("shut down")
    return 0


def _log_serving(state: AppState, config: ServerConfig, binds: list[str]) -> None:
    protocols = "HTTP/1.1 and HTTP/2 (ALPN)" if config.tls else "HTTP/1.1 and h2c"
    models = []
    for served in state.router.models:
        mc = served.config
        if mc is None:
            continue
        details = [mc.dtype, mc.device, f"max_model_len={mc.max_model_len}"]
        if mc.task == "embed":
            details.insert(0, f"embeddings of {mc.embedding_size}")
        elif mc.task == "score":
            details.insert(0, "a cross-encoder")
        elif mc.task == "classify":
            details.insert(0, f"a classifier of {len(mc.labels or ())} labels")
        if len(served.replicas) > 1:
            details.append(f"{len(served.replicas)} replicas")
        if served.loras:
            details.append(f"LoRA adapters {', '.join(served.loras)}")
        models.append(f"{mc.model} ({', '.join(details)})")
    log.info(
        "serving %s on %s, %s%s",
        " and ".join(models) or config.engine.model,
        ", ".join(binds),
        protocols,
        "; API key required" if config.api_key else "",
    )


def run(config: ServerConfig) -> int:
    setup_logging(config.log_level)
    return trio.run(partial(serve, config))
