"""What both ends of a ring share: the views, the fences, the doorbells, and the one blocking loop.

Owns the doorbell protocol. Each ring has two eventfds: "data" (the producer wakes a sleeping
consumer) and "space" (the consumer wakes a producer waiting on a full ring). Ringing on every
message would cost a system call per message (0.7 us here, more than the rest of a send), so a
side rings only when the other has announced that it sleeps: the consumer sets
`consumer_sleeping` (a fresh epoch number), fences, re-reads the tail, and only then blocks; the
producer writes the tail, then reads `consumer_sleeping` and rings once per epoch. Symmetrically,
a producer facing a full ring sets `wake_at` (the head position at which a quarter of the ring, or
what its message needs, is free: one wake-up per batch, not per message), fences, re-reads the
head and blocks; the consumer rings once it has moved the head past `wake_at`. That is Dekker's
pattern, with the fences of `_fence`.

The eventfd counter persists, so a ring that lands between the sleeper's check and its
`epoll_wait` still wakes it. A closing side rings unconditionally. A dead peer is noticed
through a pidfd (`ShmRing.watch_peer`) that sits in the same epoll set as the doorbell, so a
blocked operation wakes up when the peer exits, however it exits.

Every wait, blocking or async, is a `Wait`: `ready()` (look, and raise if it will never be
ready), `arm()` (announce the sleep, fence, look once more: False means look again now) and the
endpoint's `_disarm()`. `Endpoint._wait` is the blocking loop over it; `_async._Queue.turn` the
AnyIO one.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import anyio

from trio_llm.ipc._fence import fences
from trio_llm.ipc._layout import OFF_DATA, Q_DATA

if TYPE_CHECKING:
    from trio_llm.ipc._segment import MappedSegment


class Wait(NamedTuple):
    """What an endpoint waits for, in the terms both waiting loops use."""

    ready: Callable[[], bool]
    """True once the operation can go ahead; raises if it never will."""
    arm: Callable[[], bool]
    """Ask the peer to ring; False if that is moot (ready meanwhile: look again now)."""
    what: str
    """What was missing, for the TimeoutError: 'no message', 'no room for ...'."""


class Endpoint:
    """One side of a ring in this process: its views, fences and epoll set {doorbell, pidfd}."""

    def __init__(self, segment: MappedSegment, doorbell_fd: int, peer_doorbell_fd: int) -> None:
        self._segment = segment  # keeps the fds open (the segment's finalizer closes them)
        self._mem = segment.mem
        self._bytes_view, self._q, self._w = segment.bytes_view, segment.q, segment.w
        self._q_data = self._q[Q_DATA:]  # record headers, indexed by data offset // 8
        self._cap = segment.capacity
        self._data_end = OFF_DATA + segment.capacity
        self._doorbell_fd = doorbell_fd
        self._peer_doorbell_fd = peer_doorbell_fd
        self._fence_lock, self._slow_fence = fences(segment.fence)
        self._epoll = select.epoll()
        # Edge-triggered: every ring of the doorbell is one event, consumed by the epoll_wait that
        # reports it, so the eventfd itself is never read (one system call less per wake-up).
        # Its counter only grows, by one per ring: it would take 2**64 rings to fill it.
        self._epoll.register(doorbell_fd, select.EPOLLIN | select.EPOLLET)
        self._pidfd: int | None = None
        self._peer_dead = False
        self._closed = False
        self.messages = 0
        self.doorbells = 0
        self.waits = 0

    def close(self) -> None:
        raise NotImplementedError

    def _wait(self, wait: Wait, timeout: float | None) -> None:
        """Return once `wait.ready()`; raise if it never will be or `timeout` seconds pass."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not wait.ready():
            remaining = -1.0  # epoll: no timeout
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{wait.what} within {timeout} s")
            if wait.arm():
                self.waits += 1
                events = self._epoll.poll(remaining)
                self._disarm()
                self._collect(events)

    def _disarm(self) -> None:
        """Take down what `arm` announced."""
        raise NotImplementedError

    def _raise_if_unusable(self) -> None:
        """Raise if this end can do nothing more (each end knows its reasons)."""
        self._check_open()

    def _watch(self, pidfd: int) -> None:
        self._pidfd = pidfd
        self._epoll.register(pidfd, select.EPOLLIN)

    def _peer_died(self) -> None:
        self._peer_dead = True

    def _wait_fd(self) -> int:
        """Readable when the doorbell rang or the peer died: what the AnyIO face waits on."""
        return self._epoll.fileno()

    def _collect(self, events: list[tuple[int, int]] | None = None) -> None:
        """Note what woke us (`None`: look now): a dead peer matters; a doorbell event is
        consumed already."""
        if events is None:
            events = self._epoll.poll(0)
        for fd, _ in events:
            if fd == self._pidfd:
                self._peer_died()

    def _ring_peer(self) -> None:
        self.doorbells += 1
        os.eventfd_write(self._peer_doorbell_fd, 1)

    def _release(self) -> None:
        self._epoll.close()
        self._q_data.release()

    def _check_open(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError(f"this {type(self).__name__} was closed")
