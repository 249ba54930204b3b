"""/v1/files and /v1/batches: OpenAI's Files and Batch APIs, over the stores under --batch-dir
and the runner (a task in the app's nursery for as long as it serves).

Without --batch-dir every route answers a 400 that says to start the server with it. The
handlers only glue: files and batches are read and written by files.py and store.py (on a
worker thread: disk I/O), the work is the runner's (runner.py), whose lines reuse the online
endpoints' handlers (lines.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, TypeVar

import trio
from quart import Response, current_app, request
from quart_trio import QuartTrio

from trio_llm.http.batch.files import PURPOSES, FileStore, sortable_id
from trio_llm.http.batch.lines import check_model_on, run_line
from trio_llm.http.batch.protocol import (
    ACTIVE,
    BATCH_ENDPOINTS,
    COMPLETION_WINDOWS,
    BatchList,
    BatchObject,
    CreateBatch,
    FileDeleted,
    FileList,
    FileObject,
    InputLine,
    OutputLine,
)
from trio_llm.http.batch.runner import BatchRunner
from trio_llm.http.batch.store import BatchStore
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.ids import now
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import AppState

T = TypeVar("T", FileObject, BatchObject)
L = TypeVar("L", FileList, BatchList)

_EXTENSION = "trio_llm.batch"
_BATCH_CONCURRENCY = 4
"""Lines of a batch in flight at once (runner.py says why 4)."""


def install_batches(app: QuartTrio, state: AppState, batch_dir: Path) -> BatchRunner:
    """The stores under `batch_dir`, and the runner started in `app`'s nursery when it begins
    serving and cancelled when it stops (an unfinished batch resumes at the next start)."""
    files, store = FileStore(batch_dir), BatchStore(batch_dir)

    async def run(line: InputLine) -> OutputLine:
        return await run_line(app, line, background=True)

    runner = BatchRunner(files, store, run, check_model_on(state), concurrency=_BATCH_CONCURRENCY)
    app.extensions[_EXTENSION] = runner
    scope = trio.CancelScope()

    async def run_until_stopped() -> None:
        with scope:
            await runner.run()

    @app.before_serving
    async def start_runner() -> None:
        app.nursery.start_soon(run_until_stopped)  # type: ignore[attr-defined]

    @app.after_serving
    async def stop_runner() -> None:
        scope.cancel()

    return runner


def _runner() -> BatchRunner:
    runner = current_app.extensions.get(_EXTENSION)
    if runner is None:
        raise bad_request(
            "The Files and Batch APIs keep their files on disk: start the server with "
            "--batch-dir DIR to serve them",
            code="batch_not_enabled",
        )
    return runner


def _not_found(kind: str, given: str, param: str) -> ProtocolError:
    return ProtocolError(404, f"No {kind} with id {given!r}", param=param, code="not_found")


# -- /v1/files ------------------------------------------------------------------------------


async def upload_file() -> Response:
    runner = _runner()
    if request.mimetype != "multipart/form-data":
        raise ProtocolError(
            415,
            f"Content-Type must be multipart/form-data, got {request.mimetype or 'none'}",
            code="unsupported_media_type",
        )
    form, files = await request.form, await request.files
    purpose = form.get("purpose")
    if purpose != "batch":
        raise bad_request(
            f"purpose: this server stores files for `batch` only, got {purpose!r}",
            param="purpose",
        )
    upload = files.get("file")
    if upload is None:
        raise bad_request("file: this field is required", param="file")
    data = upload.read()
    name = upload.filename or "upload.jsonl"
    created = await trio.to_thread.run_sync(runner.files.create, name, purpose, data)
    return json_response(created)


async def list_files() -> Response:
    runner = _runner()
    purpose = request.args.get("purpose")
    if purpose is not None and purpose not in PURPOSES:
        raise bad_request(f"purpose: one of {', '.join(PURPOSES)}", param="purpose")
    found = await trio.to_thread.run_sync(runner.files.list, purpose)
    found, has_more = _page(found, request.args.get("after"), request.args.get("limit"))
    return json_response(_listing(FileList, found, has_more))


async def retrieve_file(file_id: str) -> Response:
    found = await trio.to_thread.run_sync(_runner().files.get, file_id)
    if found is None:
        raise _not_found("file", file_id, "file_id")
    return json_response(found)


async def file_content(file_id: str) -> Response:
    data = await trio.to_thread.run_sync(_runner().files.content, file_id)
    if data is None:
        raise _not_found("file", file_id, "file_id")
    return Response(data, mimetype="application/jsonl")


async def delete_file(file_id: str) -> Response:
    runner = _runner()
    reading = [
        b.id for b in runner.store.list() if b.input_file_id == file_id and b.status in ACTIVE
    ]
    if reading:  # its lines are read again to resume and to write the output in their order
        raise ProtocolError(
            409,
            f"file {file_id} is the input of batch {reading[0]}, which is not finished: "
            "cancel it or wait for it first",
            param="file_id",
            code="file_in_use",
        )
    if not await trio.to_thread.run_sync(runner.files.delete, file_id):
        raise _not_found("file", file_id, "file_id")
    return json_response(FileDeleted(id=file_id))


# -- /v1/batches ----------------------------------------------------------------------------


async def create_batch() -> Response:
    runner = _runner()
    body = await decode_body(CreateBatch)
    if body.endpoint not in BATCH_ENDPOINTS:
        raise bad_request(
            f"endpoint: a batch runs one of {', '.join(BATCH_ENDPOINTS)}, got {body.endpoint!r}",
            param="endpoint",
        )
    window = COMPLETION_WINDOWS.get(body.completion_window)
    if window is None:
        raise bad_request(
            f"completion_window: only {', '.join(COMPLETION_WINDOWS)} is supported, got "
            f"{body.completion_window!r}",
            param="completion_window",
        )
    source = await trio.to_thread.run_sync(runner.files.get, body.input_file_id)
    if source is None:
        raise _not_found("file", body.input_file_id, "input_file_id")
    if source.purpose != "batch":
        raise bad_request(
            f"input_file_id: {source.id} was not uploaded with purpose `batch`",
            param="input_file_id",
        )
    created = now()
    batch = BatchObject(
        id=sortable_id("batch_"),
        endpoint=body.endpoint,
        input_file_id=body.input_file_id,
        completion_window=body.completion_window,
        status="validating",
        created_at=created,
        expires_at=created + window,
        metadata=body.metadata,
    )
    await trio.to_thread.run_sync(runner.store.save, batch)
    runner.submitted()
    return json_response(batch)


async def retrieve_batch(batch_id: str) -> Response:
    batch = _runner().store.get(batch_id)
    if batch is None:
        raise _not_found("batch", batch_id, "batch_id")
    return json_response(batch)


async def list_batches() -> Response:
    found = _runner().store.list()
    found, has_more = _page(found, request.args.get("after"), request.args.get("limit"))
    return json_response(_listing(BatchList, found, has_more))


async def cancel_batch(batch_id: str) -> Response:
    runner = _runner()
    batch = runner.store.get(batch_id)
    if batch is None:
        raise _not_found("batch", batch_id, "batch_id")
    if batch.status in ("completed", "failed", "expired"):
        raise ProtocolError(
            409,
            f"batch {batch_id} is {batch.status}: it can no longer be cancelled",
            code="invalid_state",
        )
    batch = runner.cancel(batch)  # on the loop: it cancels the lines in flight
    return json_response(batch)


# -- listing --------------------------------------------------------------------------------


def _page(items: list[T], after: str | None, limit: str | None) -> tuple[list[T], bool]:
    """OpenAI's cursor pages: the items after the one with id `after`, at most `limit` (20 by
    default, 1 to 100 for batches; files allow up to 10,000)."""
    count = 20
    if limit is not None:
        with contextlib.suppress(ValueError):
            count = int(limit)
        if not 1 <= count <= 10_000:
            raise bad_request("limit: between 1 and 10000", param="limit")
    if after is not None:
        ids = [item.id for item in items]
        if after in ids:
            items = items[ids.index(after) + 1 :]
    return items[:count], len(items) > count


def _listing(kind: type[L], items: list[Any], has_more: bool) -> L:
    return kind(
        data=items,
        has_more=has_more,
        first_id=items[0].id if items else None,
        last_id=items[-1].id if items else None,
    )
