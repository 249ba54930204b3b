"""The AnyIO faces of a ring's ends (Trio or asyncio): the same endpoints, awaited.

Owns waiting in an event loop. Each face wraps its blocking endpoint (`.sync`) and publishes or
takes through that endpoint's own fast paths (`RingSender.try_send`, `RingReceiver.try_receive`,
`RingReceiver.receive_all_nowait`); only when they find the ring full or empty does it wait, on
the endpoint's `Wait`, in a `_Queue` turn. Invariants: every `send`/`receive` is a checkpoint,
and a cancelled one has changed nothing, because the ring is touched in one synchronous step
after the last await.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Self, TypeVar

import anyio
import anyio.lowlevel

from trio_llm.ipc._endpoint import Endpoint, Wait
from trio_llm.ipc._errors import PeerDiedError, RingClosedError
from trio_llm.ipc._receiver import RingReceiver
from trio_llm.ipc._sender import Payload, RingSender

_T = TypeVar("_T")


class _Queue:
    """Lets many tasks of one event loop share an endpoint: one waits on the doorbell at a time
    (Trio allows one waiter per fd, asyncio would silently drop the first), the others queue
    behind it in FIFO order, and nobody overtakes the queue on the fast path."""

    def __init__(self) -> None:
        self.waiting = 0
        self._lock: anyio.Lock | None = None

    def lock(self) -> anyio.Lock:
        if self._lock is None:  # made in the event loop that first needs it
            self._lock = anyio.Lock()
        return self._lock

    @contextlib.asynccontextmanager
    async def turn(self, endpoint: Endpoint, wait: Wait) -> AsyncIterator[None]:
        """Wait for this task's turn, then sleep on the doorbell until `wait.ready()`. The body
        runs in the turn with no await between the last `ready()` and it, so what it does to the
        ring happens in one synchronous step: a task cancelled here has changed nothing."""
        endpoint._raise_if_unusable()  # (a closed end raises even with others queued)
        self.waiting += 1
        try:
            async with self.lock():
                while not wait.ready():
                    if wait.arm():
                        endpoint.waits += 1
                        try:
                            await anyio.wait_readable(endpoint._wait_fd())
                        finally:
                            endpoint._disarm()
                        endpoint._collect()
                yield
        finally:
            self.waiting -= 1


class _AsyncFace:
    """What both async ends share: closing through the blocking face they wrap."""

    sync: RingSender | RingReceiver

    def close(self) -> None:
        self.sync.close()

    async def aclose(self) -> None:
        self.sync.close()
        await anyio.lowlevel.checkpoint()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.sync.close()


class AsyncRingSender(_AsyncFace):
    """The producer end for async code, on AnyIO (Trio or asyncio): `ring.async_sender()`.

    `send` is always a checkpoint. A cancelled `send` has sent nothing: the message is written
    in one synchronous step after the last await. Any number of tasks may send; a task finding
    the ring full waits, in FIFO order with the others that do.
    """

    def __init__(self, sender: RingSender) -> None:
        self.sync = sender
        """The blocking face of the same endpoint."""
        self._queue = _Queue()

    def send_nowait(self, payload: Payload) -> None:
        if self._queue.waiting:
            raise anyio.WouldBlock  # others wait for room already
        self.sync.send_nowait(payload)

    async def send(self, payload: Payload) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        sender = self.sync
        if self._queue.waiting or not sender.try_send(payload):
            async with self._queue.turn(sender, sender._room_wait(payload)):
                sent = sender.try_send(payload)
            assert sent, "the room that was there has gone: a second thread sends?"
        await anyio.lowlevel.cancel_shielded_checkpoint()


class AsyncRingReceiver(_AsyncFace):
    """The consumer end for async code, on AnyIO (Trio or asyncio): `ring.async_receiver()`.

    `receive` and `receive_batch` are always checkpoints. A cancelled receive has taken
    nothing: the ring is read in one synchronous step after the last await, so the next receive
    gets the next message. `async for` ends when the sender closes cleanly and raises
    `PeerDiedError` if the sender's process died.
    """

    def __init__(self, receiver: RingReceiver) -> None:
        self.sync = receiver
        """The blocking face of the same endpoint."""
        self._queue = _Queue()

    def receive_nowait(self) -> bytes:
        if self._queue.waiting:
            raise anyio.WouldBlock  # what arrives belongs to the tasks waiting already
        return self.sync.receive_nowait()

    def receive_all_nowait(self, max_messages: int | None = None) -> list[bytes]:
        if self._queue.waiting:
            return []
        return self.sync.receive_all_nowait(max_messages)

    async def receive(self) -> bytes:
        """Wait for the next message and take it (in FIFO order with other waiting tasks)."""
        message = await self._take(self.sync.try_receive)
        assert message is not None  # a turn ends only once a message is there to take
        return message

    async def receive_batch(self, max_messages: int | None = None) -> list[bytes]:
        """Wait for at least one message, then take all available (at most `max_messages`)."""
        receive_all = self.sync.receive_all_nowait
        return await self._take(lambda: receive_all(max_messages) or None) or []

    async def _take(self, take: Callable[[], _T | None]) -> _T | None:
        """`take()` now if nobody waits and it gets something (not None); else wait for a
        message in this task's turn and `take()` then."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        got = None if self._queue.waiting else take()
        if got is None:
            receiver = self.sync
            async with self._queue.turn(receiver, receiver._data_wait):
                got = take()
        await anyio.lowlevel.cancel_shielded_checkpoint()
        return got

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.receive()
        except PeerDiedError:
            raise
        except RingClosedError:
            raise StopAsyncIteration from None
