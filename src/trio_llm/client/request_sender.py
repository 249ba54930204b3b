"""The request ring's sending end, as every task of the client shares it: a message is posted
without waiting, and one background task writes what could not be written at once.

Invariants:
- `post` never waits: it writes to the ring at once when the ring has room and nothing is
  queued before it, else queues the message for `run`. So a cancelled or closed `generate()`
  aborts its engine requests from a `finally:` without an `await`, which a cancelled scope
  would interrupt and an async generator being finalized could not do. The queue holds at most
  one add and one abort per request in flight, plus a transcription's audio chunks (a copy of
  the samples its caller holds anyway, sent as fast as the engine reads them).
- Messages reach the engine in the order they were posted: an abort never overtakes its add.
- A ring endpoint belongs to one task: only `run` waits on the ring's sending end.
"""

from __future__ import annotations

from collections import deque

import anyio

from trio_llm.ipc import AsyncRingSender, RingClosedError


class RequestSender:
    def __init__(self, sender: AsyncRingSender) -> None:
        self._sender = sender
        self._queue: deque[bytes] = deque()
        self._queued: anyio.Event | None = None
        """Set by `post` while `run` waits for something to send."""

    @property
    def max_message_bytes(self) -> int:
        return self._sender.sync.max_message_size

    def post(self, message: bytes) -> None:
        """Send `message` to the engine without waiting: now if the ring has room and nothing
        is queued before it, else through `run`."""
        if not self._queue:
            try:
                self._sender.send_nowait(message)
            except anyio.WouldBlock:
                pass
            except RingClosedError:
                return  # the engine is going; the client's process watcher reports it
            else:
                return
        self._queue.append(message)
        if self._queued is not None:
            self._queued.set()

    def clear(self) -> None:
        """Drop what is queued (the engine has exited: nothing will read it)."""
        self._queue.clear()

    async def run(self) -> None:
        """The background task that owns the ring's sending end while it waits."""
        try:
            while True:
                while self._queue:
                    await self._sender.send(self._queue[0])
                    self._queue.popleft()
                self._queued = anyio.Event()
                await self._queued.wait()
                self._queued = None
        except RingClosedError:
            return  # the engine exited; the client's process watcher reports it
