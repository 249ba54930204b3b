"""The link to a running engine process: its two rings and its liveness, which every call of the
client (engine_client.py) shares.

What it owns: the process handle, the request ring's sending end (through `RequestSender`), the
output ring's receiving end, what the engine last reported about itself (its scheduler
statistics, its failure message, how its process ended), and three background tasks run for
`open_engine`'s block (`running`):
- the output reader reads the output ring and hands every message on (`on_outputs`, `on_lora`),
  in bounded chunks with a checkpoint between them, so one huge step never stalls the event
  loop;
- the request sender (request_sender.py) owns the request ring's sending end and writes what
  could not be written at once;
- the process watcher notices the engine's exit at once (new calls fail from then on) and,
  once the output reader has drained the output ring, fails every request still in flight.

Invariants:
- `post` never waits (`RequestSender.post`), so a cancelled or closed request can abort its
  engine requests from a `finally:` without an `await`.
- Once the engine process has exited, `check_alive` raises `EngineDeadError` at once (the
  watcher sees the exit through the process handle), and the requests in flight are failed
  (`fail_all`, exactly once) after the outputs the engine published before it died: the
  output reader, which sees the ring end only once it has drained the ring, is the one that
  fails them. (Were the watcher to fail them, it would race the reader and could turn a
  request's last tokens into an error.)
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import anyio.lowlevel

from trio_llm.client.errors import EngineDeadError
from trio_llm.client.request_sender import RequestSender
from trio_llm.ipc import AsyncRingReceiver, AsyncRingSender, RingClosedError
from trio_llm.ipc.codec import decode_engine_message, encode
from trio_llm.ipc.messages import (
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineFailure,
    LoraUpdated,
    SchedulerStats,
)

log = logging.getLogger(__name__)

OUTPUT_CHUNK = 64
"""Engine outputs the reader hands on between two checkpoints."""
DRAIN_TIMEOUT = 5.0
"""Seconds the watcher waits, after the engine exited, for the output reader to drain the ring
before it fails the requests in flight itself (a bound, should the reader be stuck)."""

OnOutputs = Callable[[Sequence[EngineCoreOutput], float], list[str]]
"""Routes a chunk of one step's outputs (received at the given time) to their requests;
returns the engine request ids to abort (their request is gone)."""


class EngineLink:
    def __init__(
        self,
        process: anyio.abc.Process,
        sender: AsyncRingSender,
        receiver: AsyncRingReceiver,
        *,
        stats: SchedulerStats,
        on_outputs: OnOutputs,
        on_lora: Callable[[LoraUpdated], None],
        fail_all: Callable[[Callable[[], BaseException]], None],
    ) -> None:
        """`stats`: the figures until the engine's first step reports its own; `fail_all`
        fails every request in flight with the errors it makes."""
        self._process = process
        self._requests = RequestSender(sender)
        self._receiver = receiver
        self._on_outputs = on_outputs
        self._on_lora = on_lora
        self._fail_all = fail_all
        self.scheduler_stats = stats
        """The engine's figures as of its latest step."""
        self._dead = anyio.Event()
        """Set once the engine process has exited (or the client closed)."""
        self._drained = anyio.Event()
        """Set once every request in flight at the engine's death has been failed."""
        self._failure: str | None = None
        """What the engine said in its EngineFailure message, if it sent one."""
        self._exit: str | None = None
        """How the engine process ended, once it has."""
        self._closed = False

    @property
    def is_alive(self) -> bool:
        """The engine process runs and the client is still open."""
        return not self._dead.is_set() and not self._closed

    @property
    def pid(self) -> int:
        return self._process.pid

    def check_alive(self) -> None:
        """`EngineDeadError`, saying why, unless the engine can take a call."""
        if self._closed:
            raise EngineDeadError("the engine was shut down: open_engine() has exited")
        if self._dead.is_set():
            raise EngineDeadError(self.dead_reason())

    def dead_reason(self) -> str:
        if self._failure is not None:
            return f"the engine failed: {self._failure}"
        if self._exit is not None:
            return f"the engine process exited unexpectedly ({self._exit})"
        return "the engine process has exited"

    def post(self, message: bytes) -> None:
        """Send `message` to the engine without waiting (`RequestSender.post`); dropped once
        the engine is gone."""
        if self.is_alive:
            self._requests.post(message)

    async def wait_dead(self) -> None:
        """Return once the engine process has exited and every request in flight then has
        had its published outputs and its `EngineDeadError`."""
        await self._drained.wait()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the background tasks for the block's duration; the link is closed after."""
        body_error: BaseException | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch_process)
            tasks.start_soon(self._read_outputs)
            tasks.start_soon(self._requests.run)
            try:
                yield
            except BaseException as exc:
                # Re-raised below, outside the task group, so that the caller gets its own
                # exception rather than an ExceptionGroup around it.
                body_error = exc
            finally:
                self._closed = True
                tasks.cancel_scope.cancel()
        if body_error is not None:
            raise body_error

    async def _read_outputs(self) -> None:
        """The one background task that reads the output ring and hands on every message;
        once the ring has ended (the engine exited and everything it published is read), it
        fails the requests still in flight."""
        since_checkpoint = 0
        try:
            while True:
                for buf in await self._receiver.receive_batch():
                    message = decode_engine_message(buf)
                    if isinstance(message, EngineCoreOutputs):
                        now = time.time()
                        outputs = message.outputs
                        for start in range(0, len(outputs), OUTPUT_CHUNK):
                            if since_checkpoint >= OUTPUT_CHUNK:
                                await anyio.lowlevel.checkpoint()
                                since_checkpoint = 0
                            chunk = outputs[start : start + OUTPUT_CHUNK]
                            since_checkpoint += len(chunk)
                            to_abort = self._on_outputs(chunk, now)
                            if to_abort:
                                self.post(encode(AbortRequests(request_ids=to_abort)))
                        self.scheduler_stats = message.stats
                    elif isinstance(message, LoraUpdated):
                        self._on_lora(message)
                    elif isinstance(message, EngineFailure):
                        log.error("the engine failed: %s\n%s", message.message, message.traceback)
                        self._failure = message.message
                    else:
                        log.warning("ignoring an unexpected %s from the engine", type(message))
        except RingClosedError:
            pass  # the engine is gone, and every output it published has been routed
        # The ring ends when the engine's process dies, often a moment before its exit status
        # is known: wait for it (bounded), so the requests' error says how the engine ended.
        with anyio.move_on_after(DRAIN_TIMEOUT):
            await self._dead.wait()
        self.fail_in_flight()

    async def _watch_process(self) -> None:
        code = await self._process.wait()
        self._exit = describe_exit(code)
        self._mark_dead()
        # The output reader fails the requests in flight once it has drained the ring; this
        # is only the bound, should it never see the ring end.
        with anyio.move_on_after(DRAIN_TIMEOUT):
            await self._drained.wait()
        if not self._closed:
            log.error("%s", self.dead_reason())
        self.fail_in_flight()

    def _mark_dead(self) -> None:
        """No new call reaches the engine from now on."""
        self._dead.set()
        self._requests.clear()

    def fail_in_flight(self) -> None:
        """Fail every request still in flight (once): the engine is gone."""
        self._mark_dead()
        if self._drained.is_set():
            return
        reason = self.dead_reason()
        self._fail_all(lambda: EngineDeadError(reason))
        self._drained.set()


def describe_exit(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
