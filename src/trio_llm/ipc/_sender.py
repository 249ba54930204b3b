"""The producer end of a ring, blocking face (the engine's): one thread sends.

Owns the tail and the producer's flags. Every send, blocking (`send`, `send_nowait`) or async
(`AsyncRingSender`), publishes through one fast path, `try_send`: write the payload, then the
header, then the tail (`_layout`), fence (`_fence`), and ring the consumer only if it announced a
sleep since the last ring (`_endpoint`). When the ring is full, `try_send` writes nothing and the
caller waits on `_room_wait(payload)`, then calls it again.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import anyio

from trio_llm.ipc._endpoint import Endpoint, Wait
from trio_llm.ipc._errors import (
    MessageTooLargeError,
    PeerDiedError,
    RingClosedError,
    RingCorruptError,
)
from trio_llm.ipc._layout import (
    HEADER_BYTES,
    OFF_BODY,
    OFF_DATA,
    Q_HEAD,
    Q_PRODUCER_WAKE_AT,
    Q_TAIL,
    RECORD_TYPE_BITS,
    W_CONSUMER_CLOSED,
    W_CONSUMER_SLEEPING,
    W_PRODUCER_CLOSED,
    record_size,
)

if TYPE_CHECKING:
    from trio_llm.ipc._segment import MappedSegment

Payload = bytes | bytearray | memoryview


def byte_view(payload: Payload) -> Payload:
    """Something whose len() is its size in bytes and that slice-assigns into an mmap."""
    if type(payload) is bytes or type(payload) is bytearray:
        return payload
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


class RingSender(Endpoint):
    """The producer end, blocking face (the engine's). One thread sends."""

    def __init__(self, segment: MappedSegment) -> None:
        self._stop = False  # closed here, closed there, or the peer died: the slow path raises
        self._peer_closed = False
        self._rung_for = 0  # the receiver's last sleeping epoch we rang for
        super().__init__(segment, segment.spec.space_fd, segment.spec.data_fd)
        self._tail: int = self._q[Q_TAIL]
        self._head_seen: int = self._q[Q_HEAD]
        if not (0 <= self._tail - self._head_seen <= self._cap) or self._tail % 8:
            raise RingCorruptError(f"tail {self._tail} / head {self._head_seen} are inconsistent")
        self.max_message_size = self._cap - HEADER_BYTES

    def try_send(self, payload: Payload) -> bool:
        """Publish one message if the ring has room for it now; False, having written nothing,
        if it has not.

        Raises `MessageTooLargeError` if it can never fit, `RingClosedError` once the receiver
        closed (a message racing with that close is dropped silently, as it would be unread),
        `PeerDiedError` once the receiving process is known to have exited. (The hot path of
        every send: it lives here, in one frame.)
        """
        if self._stop:
            self._raise_if_unusable()
        if type(payload) is not bytes:
            payload = byte_view(payload)
        n = len(payload)
        size = (n + 15) & -8  # record_size(n)
        tail = self._tail
        if tail + size - self._head_seen > self._cap and not self._room_for(size):
            return False
        offset = tail % self._cap
        body = OFF_BODY + offset
        end = body + n
        if end <= self._data_end:
            self._mem[body:end] = payload
        else:
            # The payload wraps: its first part fills the data area, the rest starts over at 0.
            first = self._data_end - body
            view = memoryview(payload)
            self._mem[body : self._data_end] = view[:first]
            self._mem[OFF_DATA : OFF_DATA + n - first] = view[first:]
        self._q_data[offset >> 3] = n | RECORD_TYPE_BITS
        tail += size
        self._q[Q_TAIL] = tail
        self._tail = tail
        self.messages += 1
        if (lock := self._fence_lock) is not None:
            lock.acquire()  # a full fence: see _fence
            lock.release()
        # The receiver sets its sleeping flag when it closes too, so this one load covers both.
        sleeping = self._w[W_CONSUMER_SLEEPING]
        if sleeping and sleeping != self._rung_for:
            self._rung_for = sleeping
            self._ring_peer()
            if self._w[W_CONSUMER_CLOSED]:
                self._peer_closed = self._stop = True
        return True

    def send_nowait(self, payload: Payload) -> None:
        """Publish one message, or raise `anyio.WouldBlock` if the ring lacks room for it now.

        Raises like `try_send` otherwise.
        """
        if not self.try_send(payload):
            raise anyio.WouldBlock

    def send(self, payload: Payload, timeout: float | None = None) -> None:
        """Publish one message, waiting for room; `TimeoutError` after `timeout` seconds.

        Raises like `try_send` otherwise.
        """
        if not self.try_send(payload):
            self._wait(self._room_wait(payload), timeout)
            sent = self.try_send(payload)
            assert sent, "the room that was there has gone: a second thread sends?"

    def _room_wait(self, payload: Payload) -> Wait:
        """What a send of `payload` that found no room waits for (`Endpoint._wait`)."""
        n = len(byte_view(payload))
        size = record_size(n)
        return Wait(
            functools.partial(self._room_for, size),
            functools.partial(self._arm, size),
            f"no room for a {n}-byte message",
        )

    def close(self) -> None:
        """End the stream: the receiver drains what was sent, then gets RingClosedError."""
        if self._closed:
            return
        self._closed = self._stop = True
        self._w[W_PRODUCER_CLOSED] = 1
        self._ring_peer()

    def _room_for(self, size: int) -> bool:
        """Slow path of send: refresh the head, validate it, refuse what can never fit."""
        if size > self._cap:
            raise MessageTooLargeError(
                f"a {size - 8}-byte message can never fit in a ring of {self._cap} bytes "
                f"(at most {self.max_message_size})"
            )
        head = self._q[Q_HEAD]
        if not (0 <= self._tail - head <= self._cap) or head % 8:
            raise RingCorruptError(f"consumer head {head} is inconsistent with tail {self._tail}")
        self._head_seen = head
        if self._w[W_CONSUMER_CLOSED]:
            self._peer_closed = self._stop = True
            self._raise_if_unusable()
        return self._tail + size - head <= self._cap

    def _arm(self, size: int) -> bool:
        """Announce that we wait for room; False if room (or a reason to stop) came already."""
        self._raise_if_unusable()
        # Sleep until the consumer has freed a quarter of the ring (or what the message needs,
        # if more): one wake-up per batch instead of a ping-pong per message.
        self._q[Q_PRODUCER_WAKE_AT] = self._tail + max(size, self._cap // 4) - self._cap
        self._slow_fence()
        try:
            room = self._room_for(size)
        except BaseException:
            self._disarm()
            raise
        if room:
            self._disarm()
        return not room

    def _disarm(self) -> None:
        self._q[Q_PRODUCER_WAKE_AT] = 0

    def _peer_died(self) -> None:
        self._peer_dead = self._stop = True

    def _raise_if_unusable(self) -> None:
        self._check_open()
        if self._peer_dead:
            raise PeerDiedError("the receiving process exited")
        if self._peer_closed:
            raise RingClosedError("the receiver closed its end of the ring")
