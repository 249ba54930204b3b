"""The consumer end of a ring, blocking face (the engine's): one thread receives.

Owns the head and the consumer's flags, and the one record parser, `_record`: it validates a
record header against what was published before trusting its length, then copies the payload out
into `bytes`. Every receive goes through one of two fast paths built on it, `try_receive` (one
message) and `receive_all_nowait` (all there are), for the blocking face and the AnyIO face
alike; both return the space once, through `_consume_to`: write the head, fence (`_fence`), and
ring the producer only if it waits for the space just returned (`_endpoint`).

A received message is always a copy: nothing handed out refers to the ring's memory, which the
producer reuses as soon as the head moves, and nothing keeps the mapping alive past `close()`.
(The zero-copy `receive_decoded` that was here could do neither: a decoder keeping a slice of its
view read what the producer wrote later, and close() could then not unmap, leaking the fds.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from trio_llm.ipc._endpoint import Endpoint, Wait
from trio_llm.ipc._errors import PeerDiedError, RingClosedError, RingCorruptError
from trio_llm.ipc._layout import (
    OFF_BODY,
    OFF_DATA,
    Q_HEAD,
    Q_PRODUCER_WAKE_AT,
    Q_TAIL,
    RECORD_TYPE_BITS,
    W_CONSUMER_CLOSED,
    W_CONSUMER_SLEEPING,
    W_PRODUCER_CLOSED,
    bad_record,
)

if TYPE_CHECKING:
    from trio_llm.ipc._segment import MappedSegment


class RingReceiver(Endpoint):
    """The consumer end, blocking face (the engine's). One thread receives."""

    def __init__(self, segment: MappedSegment) -> None:
        super().__init__(segment, segment.spec.data_fd, segment.spec.space_fd)
        self._head: int = self._q[Q_HEAD]
        self._tail_seen = self._head
        self._epoch = 0  # of our sleeps: the sender rings once per epoch
        self._rung_for = 0  # the sender's last wake-at position we rang for
        self._data_wait = Wait(self._has_message, self._arm, "no message")
        """What a receive that found the ring empty waits for."""

    def try_receive(self) -> bytes | None:
        """Take the next message if there is one now; None if the ring is empty.

        Raises `RingClosedError` (`PeerDiedError`) when it is empty and the sender closed
        (died), `RingCorruptError` when the next record is bad. (The fast path of every single
        receive, blocking or async.)
        """
        if self._closed:
            self._check_open()
        head = self._head
        if head == self._tail_seen and not self._refresh_tail():
            return None
        data = self._record(head)
        self._consume_to(head + ((len(data) + 15) & -8), 1)  # record_size(len(data))
        return data

    def receive_all_nowait(self, max_messages: int | None = None) -> list[bytes]:
        """Take every message available now (at most `max_messages`), returning space once.

        Returns an empty list when the ring is empty; raises `RingClosedError` (`PeerDiedError`)
        when it is empty and the sender closed (died), `RingCorruptError` when the next record
        is bad (after handing over the good ones before it).
        """
        if self._closed:
            self._check_open()
        head = self._head
        if head == self._tail_seen and not self._refresh_tail():
            return []
        tail, record = self._tail_seen, self._record
        budget = -1 if max_messages is None else max_messages
        out: list[bytes] = []
        while head != tail and budget != 0:
            try:
                data = record(head)
            except RingCorruptError:
                if out:
                    break  # hand over the good ones; the next call raises
                raise
            out.append(data)
            head += (len(data) + 15) & -8  # record_size(len(data))
            budget -= 1
        self._consume_to(head, len(out))
        return out

    def receive_nowait(self) -> bytes:
        """Take the next message, or raise `anyio.WouldBlock` if the ring is empty.

        Once the ring is empty and the sender has closed (or its process exited), raises
        `RingClosedError` (`PeerDiedError`) instead.
        """
        data = self.try_receive()
        if data is None:
            raise anyio.WouldBlock
        return data

    def receive(self, timeout: float | None = None) -> bytes:
        """Take the next message, waiting for one; `TimeoutError` after `timeout` seconds.

        Raises like `receive_nowait` otherwise.
        """
        data = self.try_receive()
        if data is None:
            self._wait(self._data_wait, timeout)
            data = self.try_receive()
            assert data is not None, "the message that was there has gone: a second thread?"
        return data

    def _record(self, head: int) -> bytes:
        """The payload of the record at `head`, copied out: the one record parser.

        Validates the header against what was published before trusting its length.
        """
        cap = self._cap
        offset = head % cap
        header = self._q_data[offset >> 3]
        n = header - RECORD_TYPE_BITS  # in range only if the type is right
        if not 0 <= n <= self._tail_seen - head - 8:
            raise bad_record(head, header, cap, self._tail_seen - head)
        body = OFF_BODY + offset
        end = body + n
        if end <= self._data_end:
            return self._mem[body:end]
        view = self._bytes_view  # the payload wraps: copy its two parts into one allocation
        return b"".join((view[body : self._data_end], view[OFF_DATA : end - cap]))

    def _consume_to(self, head: int, count: int) -> None:
        """Return the space up to `head`; wake the producer if it waits for that much."""
        self._q[Q_HEAD] = head
        self._head = head
        self.messages += count
        if (lock := self._fence_lock) is not None:
            lock.acquire()  # a full fence: see _fence
            lock.release()
        wake_at = self._q[Q_PRODUCER_WAKE_AT]
        if wake_at and head >= wake_at and wake_at != self._rung_for:
            self._rung_for = wake_at
            self._ring_peer()

    def close(self) -> None:
        """Stop receiving: the sender's next send raises RingClosedError."""
        if self._closed:
            return
        self._closed = True
        self._w[W_CONSUMER_CLOSED] = 1
        # A new sleeping epoch makes the sender's per-message check notice the close.
        self._w[W_CONSUMER_SLEEPING] = self._next_epoch()
        self._ring_peer()

    def _has_message(self) -> bool:
        """A message is there to take; raises if none ever will be."""
        return self._head != self._tail_seen or self._refresh_tail()

    def _refresh_tail(self) -> bool:
        """Slow path: re-read the tail; False if still empty; raise if it will stay empty."""
        tail = self._q[Q_TAIL]
        head = self._head
        if not (0 <= tail - head <= self._cap) or tail % 8:
            raise RingCorruptError(f"producer tail {tail} is inconsistent with head {head}")
        self._tail_seen = tail
        if tail != head:
            return True
        if self._w[W_PRODUCER_CLOSED] or self._peer_dead:
            # The close flag (or the exit) comes after the last publish: look once more.
            if self._q[Q_TAIL] != head:
                return self._refresh_tail()
            if self._w[W_PRODUCER_CLOSED]:
                raise RingClosedError("the sender closed its end of the ring")
            raise PeerDiedError("the sending process exited")
        return False

    def _arm(self) -> bool:
        """Announce that we sleep; False if data (or a reason to stop) came meanwhile."""
        self._check_open()
        self._w[W_CONSUMER_SLEEPING] = self._next_epoch()
        self._slow_fence()
        if self._q[Q_TAIL] != self._head or self._w[W_PRODUCER_CLOSED] or self._peer_dead:
            self._disarm()
            return False
        return True

    def _next_epoch(self) -> int:
        self._epoch = self._epoch % 0xFFFFFFFF + 1
        return self._epoch

    def _disarm(self) -> None:
        if not self._closed:  # a closed receiver keeps the flag up (see close)
            self._w[W_CONSUMER_SLEEPING] = 0
