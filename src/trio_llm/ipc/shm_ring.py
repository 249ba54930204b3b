"""The shared-memory ring: a single-producer single-consumer message ring in shared memory,
with eventfd doorbells. This module is its public face, the one to read: `ShmRing`, its two
ends in both faces (`RingSender`/`RingReceiver`, blocking, for the engine's thread;
`AsyncRingSender`/`AsyncRingReceiver`, AnyIO, for the frontend's event loop), its statistics
and its errors; `trio_llm.ipc` re-exports them.

Owns the frontend<->engine transport as one object per direction: `ShmRing` holds a segment
(`_segment`: an anonymous memfd both processes map, inherited through `pass_fds`; its endpoints
are given the `MappedSegment`, never the ring), the peer's pidfd, and this process's endpoints,
one of each kind at most (`_sender`, `_receiver`, and their AnyIO faces in `_async`). What the
bytes mean is `_layout`; why plain loads and stores are enough on x86-64, and nowhere else, is
`_fence`; how a sleeping side is woken without a lost wake-up is `_endpoint`.

Design facts it keeps (DESIGN.md, "The shared-memory ring"):
- One ring per direction, SPSC, in an anonymous memfd reachable only through its fds (nothing
  is named, so there is nothing to unlink, and nothing outlives both processes).
- Agrona-style layout: monotonic 64-bit head and tail on their own cache lines, 8-byte aligned
  records `[length][type][payload]` with the length published last, a padding record at the
  wrap; a message larger than the ring is refused (`MessageTooLargeError`), never corrupting it.
- An idle pair burns no CPU: a side blocks on its doorbell only once it announced its sleep, and
  a dead peer wakes every blocked operation (`PeerDiedError`) through its pidfd.
- x86-64 only (TSO): plain stores through the mapping are the publication; anywhere else the
  ring refuses to start rather than corrupt data.

Invariant: `close()` leaves nothing behind in this process, whatever was received before: the
endpoints hand out copies only, so once they have released their views the mapping can always
be unmapped, and the fds are closed even if it could not be.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from types import TracebackType
from typing import Literal, Self, TypeVar

import anyio

from trio_llm.ipc._async import AsyncRingReceiver, AsyncRingSender
from trio_llm.ipc._endpoint import Endpoint
from trio_llm.ipc._errors import (
    MessageTooLargeError,
    PeerDiedError,
    RingClosedError,
    RingCorruptError,
    RingError,
)
from trio_llm.ipc._layout import Q_HEAD, Q_TAIL, W_CONSUMER_CLOSED, W_PRODUCER_CLOSED
from trio_llm.ipc._receiver import RingReceiver
from trio_llm.ipc._segment import MappedSegment, RingSpec, attach_segment, create_segment
from trio_llm.ipc._sender import RingSender

__all__ = [
    "AsyncRingReceiver",
    "AsyncRingSender",
    "MessageTooLargeError",
    "PeerDiedError",
    "RingClosedError",
    "RingCorruptError",
    "RingError",
    "RingReceiver",
    "RingSender",
    "RingSpec",
    "RingStatistics",
    "ShmRing",
]

E = TypeVar("E", bound=Endpoint)


@dataclasses.dataclass(frozen=True, slots=True)
class RingStatistics:
    capacity: int
    bytes_used: int
    """Bytes of records in the ring now (headers and alignment included)."""
    messages_sent: int
    """By this process's sender."""
    messages_received: int
    """By this process's receiver."""
    sender_closed: bool
    receiver_closed: bool
    fence: str
    """'membarrier' or 'lock': how the doorbell protocol gets its StoreLoad fence."""
    doorbells_rung: int
    """System calls this process made to wake the other side."""
    waits: int
    """Times an endpoint of this process blocked on an empty or full ring."""


class ShmRing:
    """One direction of the frontend<->engine channel: the segment, its doorbells, two endpoints.

    The owner calls `create`, starts the child with `pass_fds=ring.fds` and `spec` (a msgspec
    Struct: encode it on the command line or a pipe), and the child calls `attach(spec)`. Each
    side then takes the endpoint it uses: `sender()`/`receiver()` for the blocking face,
    `async_sender()`/`async_receiver()` for the AnyIO face (the same endpoint underneath). An
    endpoint belongs to one thread; its AnyIO face may be shared by any number of tasks of that
    thread's event loop.
    """

    def __init__(self, spec: RingSpec, mem: mmap.mmap, fence: str) -> None:
        self.spec = spec
        self.capacity = spec.capacity
        self.fence = fence
        self._segment = MappedSegment(spec, mem, fence)
        self._pidfd: int | None = None
        self._peer_gone = False
        self._sender: RingSender | None = None
        self._receiver: RingReceiver | None = None
        self._async_sender: AsyncRingSender | None = None
        self._async_receiver: AsyncRingReceiver | None = None
        self._closed = False

    @property
    def fds(self) -> tuple[int, ...]:
        """The fds a child must inherit (`subprocess.Popen(..., pass_fds=ring.fds)`)."""
        return self._segment.fds

    @classmethod
    def create(cls, capacity: int, *, fence: Literal["lock", "membarrier"] = "lock") -> ShmRing:
        """Allocate a ring with `capacity` data bytes (a multiple of 8, 16 to 2**32).

        `fence` picks how the doorbell protocol fences (`_fence`). The largest message is
        `capacity - 8` bytes.
        """
        spec, mem = create_segment(capacity, fence)
        return cls(spec, mem, fence)

    @classmethod
    def attach(cls, spec: RingSpec) -> ShmRing:
        """Map a ring created by the parent, from fds inherited under the same numbers."""
        mem, fence = attach_segment(spec)
        return cls(spec, mem, fence)

    def watch_peer(self, pid: int) -> None:
        """Make blocked operations raise `PeerDiedError` once process `pid` has exited.

        The owner watches its child's pid; the child watches `os.getppid()` (and should check
        afterwards that its parent did not change meanwhile).
        """
        self._check_open()
        if self._pidfd is not None or self._peer_gone:
            raise RuntimeError("watch_peer() was already called on this ring")
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            # Gone (and reaped) already: nothing to wait on; every endpoint knows now.
            self._peer_gone = True
            for endpoint in self._endpoints():
                endpoint._peer_died()
            return
        self._pidfd = pidfd
        self._segment.adopt(pidfd)
        for endpoint in self._endpoints():
            endpoint._watch(pidfd)

    def sender(self) -> RingSender:
        """This process's producer endpoint (the same object on every call)."""
        self._check_open()
        if self._sender is None:
            self._sender = self._told(RingSender(self._segment))
        return self._sender

    def receiver(self) -> RingReceiver:
        """This process's consumer endpoint (the same object on every call)."""
        self._check_open()
        if self._receiver is None:
            self._receiver = self._told(RingReceiver(self._segment))
        return self._receiver

    def _told(self, endpoint: E) -> E:
        """`endpoint`, told what this ring knows of its peer (watched, or gone already)."""
        if self._pidfd is not None:
            endpoint._watch(self._pidfd)
        if self._peer_gone:
            endpoint._peer_died()
        return endpoint

    def async_sender(self) -> AsyncRingSender:
        """The producer endpoint's AnyIO face (the same object on every call)."""
        if self._async_sender is None:
            self._async_sender = AsyncRingSender(self.sender())
        return self._async_sender

    def async_receiver(self) -> AsyncRingReceiver:
        """The consumer endpoint's AnyIO face (the same object on every call)."""
        if self._async_receiver is None:
            self._async_receiver = AsyncRingReceiver(self.receiver())
        return self._async_receiver

    def statistics(self) -> RingStatistics:
        self._check_open()
        q, w = self._segment.q, self._segment.w
        endpoints = self._endpoints()
        return RingStatistics(
            capacity=self.capacity,
            bytes_used=q[Q_TAIL] - q[Q_HEAD],
            messages_sent=self._sender.messages if self._sender else 0,
            messages_received=self._receiver.messages if self._receiver else 0,
            sender_closed=bool(w[W_PRODUCER_CLOSED]),
            receiver_closed=bool(w[W_CONSUMER_CLOSED]),
            fence=self.fence,
            doorbells_rung=sum(e.doorbells for e in endpoints),
            waits=sum(e.waits for e in endpoints),
        )

    def close(self) -> None:
        """Close this process's endpoints (the peer sees RingClosedError), unmap, close fds.

        Idempotent. Close the ring only after the tasks using its endpoints have finished.
        """
        if self._closed:
            return
        self._closed = True
        try:
            for endpoint in self._endpoints():
                endpoint.close()
                endpoint._release()
            self._segment.unmap()
        finally:
            self._segment.close_fds()

    def _endpoints(self) -> list[Endpoint]:
        return [e for e in (self._sender, self._receiver) if e is not None]

    def _check_open(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError("this ring was closed")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ShmRing {state} capacity={self.capacity} fds={self.fds} fence={self.fence}>"
