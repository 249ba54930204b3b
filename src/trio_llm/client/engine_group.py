"""The library's way to run several engines behind one router: `open_router`.

What it owns: starting every replica of every model at once, attaching each to its slot of the
`Router` as it comes up and emptying the slot when it dies, and stopping them all on the way
out. A replica that dies is not restarted here (its requests fail; the others go on): the HTTP
server runs its own supervisor per replica (http/runtime/supervisor.py), which restarts them.

Invariant: one engine that fails to start fails the whole call with its own
`EngineStartError` (named after the model and replica), not an ExceptionGroup around it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import anyio.abc

from trio_llm.client.engine_process import log_stage, open_engine, replica_label
from trio_llm.client.errors import EngineStartError, start_error_in
from trio_llm.client.router import Router
from trio_llm.config import EngineArgs


@asynccontextmanager
async def open_router(
    *models: str | EngineArgs, data_parallel_size: int = 1, **engine_args: Any
) -> AsyncIterator[Router]:
    """Start `data_parallel_size` engines of each model, all at once, and yield a router over
    them; stop them all on the way out. A model is a name (then `engine_args` apply) or its own
    `EngineArgs`. One engine that fails to start fails the whole call with its
    `EngineStartError`, naming the model. A replica that dies is not restarted here (its
    requests fail; the others go on): the HTTP server's supervisor restarts them."""
    specs = [m if isinstance(m, EngineArgs) else EngineArgs(model=m, **engine_args) for m in models]
    router = Router.with_replicas([data_parallel_size] * len(specs))
    body_error: BaseException | None = None
    try:
        async with anyio.create_task_group() as engines:
            async with anyio.create_task_group() as starters:
                for group, args in enumerate(specs):
                    for index in range(data_parallel_size):
                        starters.start_soon(
                            engines.start, partial(_run_replica, router, group, index, args)
                        )
            try:
                yield router
            except BaseException as exc:
                body_error = exc  # re-raised as itself, not inside an ExceptionGroup
            finally:
                engines.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        start_error = start_error_in(group)
        if start_error is None:
            raise
        raise start_error from None
    if body_error is not None:
        raise body_error


async def _run_replica(
    router: Router,
    group: int,
    index: int,
    args: EngineArgs,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    label = replica_label(args, index)
    try:
        async with open_engine(args, on_stage=log_stage(label)) as client:
            router.attach(group, index, client)
            task_status.started()
            await client.wait_dead()
            router.attach(group, index, None)
            await anyio.sleep_forever()
    except EngineStartError as error:
        traceback = error.engine_traceback
        raise EngineStartError(f"{label}: {error}", engine_traceback=traceback) from None
