"""The batch runner: one long-lived task in the server's nursery that takes each batch from
`validating` to its end, oldest first, one batch at a time.

validating (check every input line) -> failed, or in_progress (run the lines) -> finalizing
(write the output and error files) -> completed; or, when the 24h window passes first, expired
(every unfinished line gets a `batch_expired` error in the error file); or, once cancelled,
cancelling (the lines in flight are aborted) -> cancelled (finished lines kept in the output).

Below interactive requests (the choice, and why): the lines are background work
(client/background.py) under any scheduling policy, and the engine's scheduler, which alone
knows each step, serves them only with what interactive requests leave: never in a step that
ends in an interactive first token, at most two rows beside interactive decodes, short prefill
chunks when alone, and their sequences preempted first (engine/step/scheduler.py, "Background
work"). The runner only keeps `concurrency` lines in flight (4 in the server): enough for the
batch to decode a few rows a step when the server is otherwise idle, few enough that its queued
lines hold no noticeable share of the model's admission capacity. It no longer waits for the
model to be idle before starting a line (the previous rule): under a steady interactive load
that starved the batch, and a line already running kept its full seat beside the interactive
requests anyway. bench/apis/batch_interference.py measures the interactive TTFT with and
without a batch running, and the batch's throughput with and without the load.

Restart: a batch's state and its finished lines live in the store (store.py); a runner started
on the same --batch-dir resumes every batch not yet at its end and skips the lines already
finished, so none runs twice. A line answered 503 (engine restarting, model at capacity) is
not finished: it waits and runs again (lines.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
import trio

from trio_llm.http.batch.files import FileStore
from trio_llm.http.batch.lines import CheckModel, check_input
from trio_llm.http.batch.protocol import (
    ACTIVE,
    BatchError,
    BatchErrors,
    BatchObject,
    InputLine,
    LineError,
    OutputLine,
    RequestCounts,
)
from trio_llm.http.batch.store import BatchStore
from trio_llm.http.ids import now
from trio_llm.http.runtime.bodies import by_body_size

log = logging.getLogger(__name__)

EXPIRED = LineError(
    code="batch_expired",
    message="This request could not be executed before the completion window expired.",
)

RunLine = Callable[[InputLine], Awaitable[OutputLine]]


class BatchRunner:
    def __init__(
        self,
        files: FileStore,
        store: BatchStore,
        run_line: RunLine,
        check_model: CheckModel,
        *,
        concurrency: int = 2,
    ) -> None:
        self.files = files
        self.store = store
        self._run_line = run_line
        self._check_model = check_model
        self._concurrency = concurrency
        self._wake = trio.Event()
        self._lines_scope: tuple[str, trio.CancelScope] | None = None

    # -- what the endpoints call -------------------------------------------------------

    def submitted(self) -> None:
        """A batch was created: the runner looks for work."""
        self._wake.set()

    def cancel(self, batch: BatchObject) -> BatchObject:
        """Mark `batch` cancelling (its lines in flight are aborted, the runner finalizes it
        as cancelled); one already at its end is returned unchanged."""
        if batch.status not in ACTIVE or batch.status == "cancelling":
            return batch
        batch = msgspec.structs.replace(batch, status="cancelling", cancelling_at=now())
        self.store.save(batch)
        if self._lines_scope is not None and self._lines_scope[0] == batch.id:
            self._lines_scope[1].cancel()
        self._wake.set()
        return batch

    # -- the task ----------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled (the server stopping): every batch to its end, oldest first."""
        task_status.started()
        while True:
            self._wake = trio.Event()
            active = [b for b in self.store.oldest_first() if b.status in ACTIVE]
            if not active:
                await self._wake.wait()
                continue
            try:
                await self.process(active[0].id)
            except Exception as error:  # a fault of the runner's own (the disk): fail the
                log.exception("batch %s: failed", active[0].id)  # batch, not the server
                self._fail(active[0].id, error)

    def _fail(self, batch_id: str, error: Exception) -> None:
        internal = BatchError(code="internal_error", message=f"the batch failed: {error}")
        batch = msgspec.structs.replace(
            self._get(batch_id),
            status="failed",
            errors=BatchErrors(data=[internal]),
            failed_at=now(),
        )
        with contextlib.suppress(OSError):
            self.store.save(batch)

    async def process(self, batch_id: str) -> None:
        batch = self._get(batch_id)
        if batch.status == "validating":
            batch = await self._validate(batch)
        if batch.status == "in_progress":
            batch = await self._run_lines(batch)
        if batch.status in ("finalizing", "cancelling"):
            await self._finalize(batch)

    def _get(self, batch_id: str) -> BatchObject:
        batch = self.store.get(batch_id)
        assert batch is not None
        return batch

    async def _input(self, batch: BatchObject) -> tuple[list[InputLine], BatchErrors | None]:
        content = await trio.to_thread.run_sync(self.files.content, batch.input_file_id)
        if content is None:
            gone = BatchError(code="file_not_found", message="the input file was deleted")
            return [], BatchErrors(data=[gone])
        lines, errors = await by_body_size(
            len(content), check_input, content, batch.endpoint, self._check_model
        )
        return lines, BatchErrors(data=errors) if errors else None

    async def _validate(self, batch: BatchObject) -> BatchObject:
        lines, errors = await self._input(batch)
        batch = self._get(batch.id)  # it may have been cancelled meanwhile
        if batch.status == "cancelling":
            return batch
        if errors is not None:
            batch = msgspec.structs.replace(batch, status="failed", errors=errors, failed_at=now())
        else:
            batch = msgspec.structs.replace(
                batch,
                status="in_progress",
                in_progress_at=now(),
                request_counts=RequestCounts(total=len(lines)),
            )
        self.store.save(batch)
        return batch

    async def _run_lines(self, batch: BatchObject) -> BatchObject:
        lines, errors = await self._input(batch)
        if errors is not None:  # the file changed under the batch (deleted)
            batch = msgspec.structs.replace(batch, status="failed", errors=errors, failed_at=now())
            self.store.save(batch)
            return batch
        done = await trio.to_thread.run_sync(self.store.done, batch.id)
        counts = batch.request_counts = _counts(lines, done)
        pending = [line for line in lines if line.custom_id not in done]
        log.info("batch %s: %d lines to run, %d already done", batch.id, len(pending), len(done))
        deadline = trio.current_time() + max(0.0, batch.expires_at - time.time())
        slots = trio.Semaphore(self._concurrency)

        async def run_one(line: InputLine) -> None:
            try:
                output = await self._run_line(line)
                await trio.to_thread.run_sync(self.store.append_done, batch.id, output)
                if output.succeeded:
                    counts.completed += 1
                else:
                    counts.failed += 1
            finally:
                slots.release()

        scope = trio.CancelScope(deadline=deadline)
        self._lines_scope = (batch.id, scope)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    for line in pending:
                        await slots.acquire()
                        nursery.start_soon(run_one, line)
        finally:
            self._lines_scope = None
        batch = self._get(batch.id)
        if batch.status != "cancelling":
            batch = msgspec.structs.replace(batch, status="finalizing", finalizing_at=now())
        batch.request_counts = counts
        self.store.save(batch)
        return batch

    async def _finalize(self, batch: BatchObject) -> None:
        lines, _ = await self._input(batch)
        done = await trio.to_thread.run_sync(self.store.done, batch.id)
        expired = batch.status != "cancelling" and any(ln.custom_id not in done for ln in lines)
        outputs, errors = [], []
        for line in lines:
            finished = done.get(line.custom_id)
            if finished is None and expired:
                finished = OutputLine(
                    id=f"batch_req_{line.custom_id}", custom_id=line.custom_id,
                    response=None, error=EXPIRED,
                )  # fmt: skip
            if finished is not None:
                (outputs if finished.succeeded else errors).append(finished)

        def write(kind: str, found: list[OutputLine]) -> str | None:
            if not found:
                return None
            data = b"".join(msgspec.json.encode(o) + b"\n" for o in found)
            return self.files.create(f"{batch.id}_{kind}.jsonl", "batch_output", data).id

        output_id = await trio.to_thread.run_sync(write, "output", outputs)
        error_id = await trio.to_thread.run_sync(write, "error", errors)
        stamp = now()
        status, stamps = (
            ("cancelled", {"cancelled_at": stamp})
            if batch.status == "cancelling"
            else ("expired", {"expired_at": stamp})
            if expired
            else ("completed", {"completed_at": stamp})
        )
        counts = RequestCounts(total=len(lines), completed=len(outputs), failed=len(errors))
        batch = msgspec.structs.replace(
            batch,
            status=status,
            output_file_id=output_id,
            error_file_id=error_id,
            request_counts=counts,
            **stamps,
        )
        self.store.save(batch)
        log.info("batch %s: %s (%d ok, %d failed)", batch.id, status, len(outputs), len(errors))


def _counts(lines: list[InputLine], done: dict[str, OutputLine]) -> RequestCounts:
    finished = [done[ln.custom_id] for ln in lines if ln.custom_id in done]
    ok = sum(o.succeeded for o in finished)
    return RequestCounts(total=len(lines), completed=ok, failed=len(finished) - ok)
