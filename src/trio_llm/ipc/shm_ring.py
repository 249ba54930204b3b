"""A single-producer single-consumer message ring in shared memory, with eventfd doorbells.

This module owns the frontend<->engine transport: one `ShmRing` per direction, each an anonymous
memfd mapped by both processes (the child inherits the fds through `subprocess`'s `pass_fds`), so
nothing is ever named in /dev/shm and the kernel frees the memory when the last fd or mapping
goes, whatever way either process ends.

Segment layout (little-endian; every field after the preamble is written by one side only):

    0    magic u64, version u32, record type u32, capacity u64, fence mode u32   (create writes)
    128  tail u64   | producer_closed u32 | producer_waiting u32    (producer's cache lines)
    256  head u64   | consumer_closed u32 | consumer_sleeping u32   (consumer's cache lines)
    512  data[capacity]: records [u32 length][u32 type][payload], 8-byte aligned

`head` and `tail` are monotonic byte positions (never wrapped; 2**64 bytes is out of reach), so
`tail - head` is the number of bytes in use and `position % capacity` the offset of a record.
A record's 8-byte header is always contiguous (offsets and capacity are multiples of 8) and is
written with one aligned 8-byte store; its payload may wrap around the end of the data area and
continue at its start. That deviates from the padding-record layout of the design notes on
purpose: with padding, a message larger than about half the ring finds no contiguous room even in
an empty ring whose head sits mid-way, and would wait forever; here any message up to
`capacity - 8` bytes fits once the ring has drained, at every offset. The receiver copies the
payload out either way, so contiguity would buy nothing.

Invariants:
- 0 <= tail - head <= capacity, both multiples of 8. The producer alone writes the data between
  tail and head + capacity; the consumer only reads the data between head and tail. A reader
  validates everything it reads from the other side (positions, record length and type) and
  raises `RingCorruptError` rather than read out of bounds; the segment's size is sealed, so a
  peer cannot shrink it under our mapping either.
- A message is published by writing its payload, then its header, then the tail. Space is
  returned by writing the head after the payload was copied out.

Memory ordering. CPython reads and writes shared memory with plain loads and stores (memoryview
items, slice copies). That is correct on x86-64 only: under TSO stores become visible in program
order and loads are not reordered with other loads, so a consumer that sees a tail also sees the
record before it, and a producer that sees a head sees that the consumer is done with the bytes
before it. Other architectures would need real fences; `create` and `attach` refuse them.

Doorbells, and why no wake-up is lost. Each ring has two eventfds: "data" (the producer wakes a
sleeping consumer) and "space" (the consumer wakes a producer waiting on a full ring). Ringing on
every message would cost a system call per message (0.7 us here, more than the rest of a send),
so a side rings only when the other has announced that it sleeps: the consumer sets
`consumer_sleeping` (a fresh epoch number), fences, re-reads the tail, and only then blocks; the
producer writes the tail, then reads `consumer_sleeping` and rings once per epoch. Symmetrically,
a producer facing a full ring sets `wake_at` (the head position at which a quarter of the ring, or
what its message needs, is free: one wake-up per batch, not per message), fences, re-reads the
head and blocks; the consumer rings once it has moved the head past `wake_at`. That is Dekker's
pattern, and it needs a StoreLoad fence on both sides, the one reordering x86 does allow (a store
can wait in the store buffer while a later load completes). Two ways to get one from Python,
chosen once per ring and recorded in the preamble:

- "lock" (the default): acquiring and releasing an uncontended `threading.Lock` executes a
  LOCK-prefixed read-modify-write inside libc (`sem_trywait`/`sem_post` on CPython 3.11, an
  atomic compare-exchange in 3.13's `PyMutex`), which is a full fence on x86; the C compiler cannot
  move the surrounding stores across the opaque calls either. Both sides pay it on every message,
  about 0.2 us here.
- "membarrier": the asymmetric form. The side about to sleep calls
  membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), and the kernel makes every running thread of every
  registered process (ours register in create/attach) execute a full barrier; wherever the peer's
  barrier lands (before its position store, between store and flag load, or after the load), one
  side sees the other's store. The hot path then needs no fence, but each sleep costs an IPI to
  the other CPUs, which in a VM under load took tens of microseconds (bench/results/ipc.md), so
  it is the choice for dedicated cores only.

The eventfd counter persists, so a ring that lands between the sleeper's check and its
`epoll_wait` still wakes it. A closing side rings unconditionally. The two-process stress test (a
million messages through a small ring, random pauses on both sides, in both fence modes)
exercises all of this; it cannot prove the fences necessary (with them removed it still passed
three runs out of three here: the race window is a few store-buffer drains wide), only that the
protocol loses nothing with them.

A dead peer is noticed through a pidfd (`watch_peer`) that sits in the same epoll set as the
doorbell, so a blocked operation wakes up when the peer exits, however it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import functools
import mmap
import os
import platform
import secrets
import select
import struct
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Literal, Self, TypeVar

import anyio
import anyio.lowlevel
import msgspec

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


class RingError(Exception):
    """Base class of the ring's errors."""


class RingClosedError(RingError):
    """The other side closed its end; a receiver sees this only after draining every message."""


class PeerDiedError(RingClosedError):
    """The process on the other side exited (noticed through its pidfd)."""


class RingCorruptError(RingError):
    """The shared segment holds something the protocol never writes; the ring is unusable."""


class MessageTooLargeError(RingError, ValueError):
    """The message can never fit in this ring; nothing was written."""


_MAGIC = int.from_bytes(b"trioRNG\x01", "little")
_VERSION = 1
_RECORD_MESSAGE = 0x3147534D  # b"MSG1": the only record type
_RECORD_TYPE_BITS = _RECORD_MESSAGE << 32  # a header as one u64: length | type << 32
_LENGTH_MASK = 0xFFFFFFFF
_HEADER_BYTES = 8
_PREAMBLE = struct.Struct("<QIIQI")  # magic, version, record type, capacity, fence mode
_FENCE_MODES = {"membarrier": 1, "lock": 2}

# Byte offsets, and the same as indices into u64 (_Q_*) and u32 (_W_*) views of the segment.
# The positions, written on every message, and the flags, written only around sleeps and
# closes but read on every message by the other side, live 128 bytes apart (a cache line and
# its prefetch buddy), so the per-message reads never pull a line the other side keeps writing.
_OFF_TAIL = 128
_OFF_PRODUCER_FLAGS = 256  # closed u32 | pad u32 | wake_at u64
_OFF_HEAD = 384
_OFF_CONSUMER_FLAGS = 512  # closed u32 | sleeping u32
_OFF_DATA = 1024
_Q_TAIL = _OFF_TAIL // 8
_W_PRODUCER_CLOSED = _OFF_PRODUCER_FLAGS // 4
_Q_PRODUCER_WAKE_AT = _OFF_PRODUCER_FLAGS // 8 + 1
_Q_HEAD = _OFF_HEAD // 8
_W_CONSUMER_CLOSED = _OFF_CONSUMER_FLAGS // 4
_W_CONSUMER_SLEEPING = _OFF_CONSUMER_FLAGS // 4 + 1
_Q_DATA = _OFF_DATA // 8
_OFF_BODY = _OFF_DATA + _HEADER_BYTES  # where the payload of a record at data offset 0 starts

_NOWAIT = float("-inf")
"""The timeout `send_nowait`/`receive_nowait` pass to `send`/`receive`: raise WouldBlock."""

_T = TypeVar("_T")

MIN_CAPACITY = 16
MAX_CAPACITY = 1 << 32  # a record length is a u32


def _check_platform() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RingError(
            f"the shared-memory ring relies on x86-64 store ordering (TSO) and has no fences for "
            f"{platform.machine()!r}; refusing to run rather than corrupt messages"
        )


_NR_MEMBARRIER = 324  # x86-64
_MEMBARRIER_CMD_GLOBAL_EXPEDITED = 1 << 1
_MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED = 1 << 2


@functools.cache
def _membarrier() -> Callable[[], None] | None:
    """Register this process for expedited global membarriers; the barrier, or None if refused."""
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    if syscall(_NR_MEMBARRIER, _MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0) != 0:
        return None

    def barrier() -> None:
        if syscall(_NR_MEMBARRIER, _MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"membarrier: {os.strerror(errno)}")

    return barrier


def _lock_fence(lock: threading.Lock) -> Callable[[], None]:
    """A full fence from a lock round trip (see the module docstring)."""
    acquire, release = lock.acquire, lock.release

    def fence() -> None:
        acquire()
        release()

    return fence


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _byte_view(payload: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    """Something whose len() is its size in bytes and that slice-assigns into an mmap."""
    if type(payload) is bytes or type(payload) is bytearray:
        return payload
    view = memoryview(payload)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


class RingSpec(msgspec.Struct, frozen=True, array_like=True):
    """What a child needs to attach: the inherited fd numbers and the capacity."""

    mem_fd: int
    data_fd: int
    """eventfd: the producer rings it when the consumer sleeps on an empty ring."""
    space_fd: int
    """eventfd: the consumer rings it when the producer waits on a full ring."""
    capacity: int


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
        self._mem = mem
        view = memoryview(mem)
        self._views = (view, view.cast("Q"), view.cast("I"))
        self._pidfd: int | None = None
        self._peer_gone = False
        self._sender: RingSender | None = None
        self._receiver: RingReceiver | None = None
        self._async_sender: AsyncRingSender | None = None
        self._async_receiver: AsyncRingReceiver | None = None
        self._closed = False
        # Close our fds even if the caller forgets to; close() runs it early.
        self._finalizer = weakref.finalize(self, _close_fds, list(self.fds))

    @property
    def fds(self) -> tuple[int, ...]:
        """The fds a child must inherit (`subprocess.Popen(..., pass_fds=ring.fds)`)."""
        return (self.spec.mem_fd, self.spec.data_fd, self.spec.space_fd)

    @classmethod
    def create(cls, capacity: int, *, fence: Literal["lock", "membarrier"] = "lock") -> ShmRing:
        """Allocate a ring with `capacity` data bytes (a multiple of 8, 16 to 2**32).

        `fence` picks how the doorbell protocol fences (module docstring). The largest message
        is `capacity - 8` bytes.
        """
        _check_platform()
        if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY) or capacity % 8:
            raise ValueError(
                f"capacity must be a multiple of 8 between {MIN_CAPACITY} and {MAX_CAPACITY}, "
                f"got {capacity}"
            )
        if fence not in _FENCE_MODES:
            raise ValueError(f"fence must be 'lock' or 'membarrier', got {fence!r}")
        if fence == "membarrier" and _membarrier() is None:
            raise RingError("membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) is not available here")
        fds: list[int] = []
        try:
            # CLOEXEC: only a child given the fds in pass_fds inherits them.
            mem_fd = os.memfd_create(
                f"trio-llm-ring-{os.getpid()}-{secrets.token_hex(8)}",
                os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING,
            )
            fds.append(mem_fd)
            os.ftruncate(mem_fd, _OFF_DATA + capacity)
            # Neither side can resize the segment under the other's mapping (no SIGBUS).
            fcntl.fcntl(
                mem_fd,
                fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL,
            )
            data_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            fds.append(data_fd)
            space_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            fds.append(space_fd)
            mem = mmap.mmap(mem_fd, _OFF_DATA + capacity)
        except BaseException:
            _close_fds(fds)
            raise
        _PREAMBLE.pack_into(
            mem, 0, _MAGIC, _VERSION, _RECORD_MESSAGE, capacity, _FENCE_MODES[fence]
        )
        return cls(RingSpec(mem_fd, data_fd, space_fd, capacity), mem, fence)

    @classmethod
    def attach(cls, spec: RingSpec) -> ShmRing:
        """Map a ring created by the parent, from fds inherited under the same numbers."""
        _check_platform()
        for fd in (spec.mem_fd, spec.data_fd, spec.space_fd):
            try:
                os.fstat(fd)
            except OSError as exc:
                raise RingError(
                    f"fd {fd} of {spec} is not open here: the parent must pass ring.fds "
                    f"to the child (subprocess pass_fds=)"
                ) from exc
        size = os.fstat(spec.mem_fd).st_size
        if size != _OFF_DATA + spec.capacity:
            raise RingCorruptError(
                f"segment is {size} bytes, expected {_OFF_DATA + spec.capacity} for {spec}"
            )
        mem = mmap.mmap(spec.mem_fd, size)
        magic, version, record_type, capacity, mode = _PREAMBLE.unpack_from(mem, 0)
        fence = {v: k for k, v in _FENCE_MODES.items()}.get(mode)
        if (magic, version, record_type, capacity) != (
            _MAGIC,
            _VERSION,
            _RECORD_MESSAGE,
            spec.capacity,
        ) or fence is None:
            mem.close()
            raise RingCorruptError(
                f"segment preamble (magic {magic:#x}, version {version}, capacity {capacity}, "
                f"fence mode {mode}) does not match a version {_VERSION} ring of capacity "
                f"{spec.capacity}"
            )
        if fence == "membarrier" and _membarrier() is None:
            mem.close()
            raise RingError(
                "the ring was created with membarrier fences, which this process cannot use"
            )
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
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_fds, [*self.fds, pidfd])
        for endpoint in self._endpoints():
            endpoint._watch(pidfd)

    def sender(self) -> RingSender:
        """This process's producer endpoint (the same object on every call)."""
        self._check_open()
        if self._sender is None:
            self._sender = RingSender(self)
        return self._sender

    def receiver(self) -> RingReceiver:
        """This process's consumer endpoint (the same object on every call)."""
        self._check_open()
        if self._receiver is None:
            self._receiver = RingReceiver(self)
        return self._receiver

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
        _, q, w = self._views
        endpoints = self._endpoints()
        return RingStatistics(
            capacity=self.capacity,
            bytes_used=q[_Q_TAIL] - q[_Q_HEAD],
            messages_sent=self._sender.messages if self._sender else 0,
            messages_received=self._receiver.messages if self._receiver else 0,
            sender_closed=bool(w[_W_PRODUCER_CLOSED]),
            receiver_closed=bool(w[_W_CONSUMER_CLOSED]),
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
            for view in reversed(self._views):
                view.release()  # (after the endpoints released the views they sliced from these)
            self._mem.close()
        finally:
            self._finalizer()  # the fds go, even if something still held the mapping

    def _endpoints(self) -> list[_Endpoint]:
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


class _Endpoint:
    """What both endpoints share: the views, the fences, the epoll set {doorbell, peer pidfd}."""

    def __init__(self, ring: ShmRing, doorbell_fd: int, peer_doorbell_fd: int) -> None:
        self._ring = ring  # keeps the fds open (the ring's finalizer closes them)
        self._mem = ring._mem
        self._bytes_view, self._q, self._w = ring._views
        self._q_data = self._q[_Q_DATA:]  # record headers, indexed by data offset // 8
        self._cap = ring.capacity
        self._data_end = _OFF_DATA + ring.capacity
        self._doorbell_fd = doorbell_fd
        self._peer_doorbell_fd = peer_doorbell_fd
        if ring.fence == "membarrier":
            barrier = _membarrier()
            assert barrier is not None  # create/attach checked
            self._fence_lock: threading.Lock | None = None  # the hot path needs no fence
            self._slow_fence = barrier
        else:
            self._fence_lock = threading.Lock()
            self._slow_fence = _lock_fence(self._fence_lock)
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
        if ring._pidfd is not None:
            self._watch(ring._pidfd)
        if ring._peer_gone:
            self._peer_died()

    def _watch(self, pidfd: int) -> None:
        self._pidfd = pidfd
        self._epoll.register(pidfd, select.EPOLLIN)

    def _peer_died(self) -> None:
        self._peer_dead = True

    def _wait_fd(self) -> int:
        """Readable when the doorbell rang or the peer died: what the AnyIO face waits on."""
        return self._epoll.fileno()

    def _collect(self, events: list[tuple[int, int]]) -> None:
        """Note what woke us: a dead peer matters; a doorbell event is consumed already."""
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


class RingSender(_Endpoint):
    """The producer end, blocking face (the engine's). One thread sends."""

    def __init__(self, ring: ShmRing) -> None:
        self._stop = False  # closed here, closed there, or the peer died: the slow path raises
        self._peer_closed = False
        self._rung_for = 0  # the receiver's last sleeping epoch we rang for
        super().__init__(ring, ring.spec.space_fd, ring.spec.data_fd)
        self._tail: int = self._q[_Q_TAIL]
        self._head_seen: int = self._q[_Q_HEAD]
        if not (0 <= self._tail - self._head_seen <= self._cap) or self._tail % 8:
            raise RingCorruptError(f"tail {self._tail} / head {self._head_seen} are inconsistent")
        self.max_message_size = self._cap - _HEADER_BYTES

    def send_nowait(self, payload: bytes | bytearray | memoryview) -> None:
        """Publish one message, or raise `anyio.WouldBlock` if the ring lacks room for it now.

        Raises `MessageTooLargeError` if it can never fit, `RingClosedError` once the receiver
        closed (a message racing with that close is dropped silently, as it would be unread),
        `PeerDiedError` once the receiving process is known to have exited.
        """
        self.send(payload, _NOWAIT)

    def send(self, payload: bytes | bytearray | memoryview, timeout: float | None = None) -> None:
        """Publish one message, waiting for room; `TimeoutError` after `timeout` seconds.

        Raises like `send_nowait` otherwise. (The hot path lives here, in one frame.)
        """
        if self._stop:
            self._raise_if_unusable()
        if type(payload) is not bytes:
            payload = _byte_view(payload)
        n = len(payload)
        size = (n + 15) & -8
        tail = self._tail
        if tail + size - self._head_seen > self._cap and not self._room_for(size):
            if timeout == _NOWAIT:
                raise anyio.WouldBlock
            self._wait_for_room(size, timeout)
        offset = tail % self._cap
        body = _OFF_BODY + offset
        end = body + n
        if end <= self._data_end:
            self._mem[body:end] = payload
        else:
            # The payload wraps: its first part fills the data area, the rest starts over at 0.
            first = self._data_end - body
            view = memoryview(payload)
            self._mem[body : self._data_end] = view[:first]
            self._mem[_OFF_DATA : _OFF_DATA + n - first] = view[first:]
        self._q_data[offset >> 3] = n | _RECORD_TYPE_BITS
        tail += size
        self._q[_Q_TAIL] = tail
        self._tail = tail
        self.messages += 1
        if (lock := self._fence_lock) is not None:
            lock.acquire()  # a full fence: see the module docstring
            lock.release()
        # The receiver sets its sleeping flag when it closes too, so this one load covers both.
        sleeping = self._w[_W_CONSUMER_SLEEPING]
        if sleeping and sleeping != self._rung_for:
            self._rung_for = sleeping
            self._ring_peer()
            if self._w[_W_CONSUMER_CLOSED]:
                self._peer_closed = self._stop = True

    def _wait_for_room(self, size: int, timeout: float | None) -> None:
        """Return once `size` bytes are free; raise if they never will or `timeout` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._room_for(size):
            if deadline is None:
                self._sleep(size, -1.0)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"ring full for {timeout} s ({size - 8}-byte message)")
            self._sleep(size, remaining)

    def _sleep(self, size: int, timeout: float) -> None:
        if self._arm(size):
            self.waits += 1
            events = self._epoll.poll(timeout)
            self._disarm()
            self._collect(events)

    def close(self) -> None:
        """End the stream: the receiver drains what was sent, then gets RingClosedError."""
        if self._closed:
            return
        self._closed = self._stop = True
        self._w[_W_PRODUCER_CLOSED] = 1
        self._ring_peer()

    def _room_for(self, size: int) -> bool:
        """Slow path of send: refresh the head, validate it, refuse what can never fit."""
        if size > self._cap:
            raise MessageTooLargeError(
                f"a {size - 8}-byte message can never fit in a ring of {self._cap} bytes "
                f"(at most {self.max_message_size})"
            )
        head = self._q[_Q_HEAD]
        if not (0 <= self._tail - head <= self._cap) or head % 8:
            raise RingCorruptError(f"consumer head {head} is inconsistent with tail {self._tail}")
        self._head_seen = head
        if self._w[_W_CONSUMER_CLOSED]:
            self._peer_closed = self._stop = True
            self._raise_if_unusable()
        return self._tail + size - head <= self._cap

    def _arm(self, size: int) -> bool:
        """Announce that we wait for room; False if room (or a reason to stop) came already."""
        self._raise_if_unusable()
        # Sleep until the consumer has freed a quarter of the ring (or what the message needs,
        # if more): one wake-up per batch instead of a ping-pong per message.
        self._q[_Q_PRODUCER_WAKE_AT] = self._tail + max(size, self._cap // 4) - self._cap
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
        self._q[_Q_PRODUCER_WAKE_AT] = 0

    def _peer_died(self) -> None:
        self._peer_dead = self._stop = True

    def _raise_if_unusable(self) -> None:
        self._check_open()
        if self._peer_dead:
            raise PeerDiedError("the receiving process exited")
        if self._peer_closed:
            raise RingClosedError("the receiver closed its end of the ring")


class RingReceiver(_Endpoint):
    """The consumer end, blocking face (the engine's). One thread receives."""

    def __init__(self, ring: ShmRing) -> None:
        super().__init__(ring, ring.spec.data_fd, ring.spec.space_fd)
        self._head: int = self._q[_Q_HEAD]
        self._tail_seen = self._head
        self._epoch = 0  # of our sleeps: the sender rings once per epoch
        self._rung_for = 0  # the sender's last wake-at position we rang for

    def receive_nowait(self) -> bytes:
        """Take the next message, or raise `anyio.WouldBlock` if the ring is empty.

        Once the ring is empty and the sender has closed (or its process exited), raises
        `RingClosedError` (`PeerDiedError`) instead.
        """
        return self.receive(_NOWAIT)

    def receive(self, timeout: float | None = None) -> bytes:
        """Take the next message, waiting for one; `TimeoutError` after `timeout` seconds.

        Raises like `receive_nowait` otherwise. (The hot path lives here, in one frame.)
        """
        if self._closed:
            self._check_open()
        head = self._head
        if head == self._tail_seen and not self._refresh_tail():
            if timeout == _NOWAIT:
                raise anyio.WouldBlock
            self._wait_for_data(timeout)
        offset = head % self._cap
        header = self._q_data[offset >> 3]
        n = header - _RECORD_TYPE_BITS  # in range only if the type is right
        if not 0 <= n <= self._tail_seen - head - 8:
            raise self._corrupt(head, header)
        body = _OFF_BODY + offset
        end = body + n
        data = self._mem[body:end] if end <= self._data_end else self._join_wrapped(body, end)
        head += (n + 15) & -8
        self._q[_Q_HEAD] = head
        self._head = head
        self.messages += 1
        if (lock := self._fence_lock) is not None:
            lock.acquire()  # a full fence: see the module docstring
            lock.release()
        wake_at = self._q[_Q_PRODUCER_WAKE_AT]
        if wake_at and head >= wake_at and wake_at != self._rung_for:
            self._rung_for = wake_at
            self._ring_peer()
        return data

    def receive_all_nowait(self, max_messages: int | None = None) -> list[bytes]:
        """Take every message available now (at most `max_messages`), returning space once.

        Returns an empty list when the ring is empty; raises `RingClosedError` (`PeerDiedError`)
        when it is empty and the sender closed (died).
        """
        self._check_open()
        head = self._head
        if head == self._tail_seen and not self._refresh_tail():
            return []
        mem, headers, cap, data_end = self._mem, self._q_data, self._cap, self._data_end
        tail = self._tail_seen
        budget = -1 if max_messages is None else max_messages
        out: list[bytes] = []
        append = out.append
        while head != tail and budget != 0:
            offset = head % cap
            header = headers[offset >> 3]
            n = header - _RECORD_TYPE_BITS
            if not 0 <= n <= tail - head - 8:
                if out:
                    break  # hand over the good ones; the next call raises
                raise self._corrupt(head, header)
            body = _OFF_BODY + offset
            end = body + n
            if end <= data_end:
                append(mem[body:end])
            else:
                append(self._join_wrapped(body, end))
            head += (n + 15) & -8
            budget -= 1
        self._consume_to(head, len(out))
        return out

    def _consume_to(self, head: int, count: int) -> None:
        """Return the space up to `head` to the producer; wake it if it waits for that much."""
        self._q[_Q_HEAD] = head
        self._head = head
        self.messages += count
        if (lock := self._fence_lock) is not None:
            lock.acquire()  # a full fence: see the module docstring
            lock.release()
        wake_at = self._q[_Q_PRODUCER_WAKE_AT]
        if wake_at and head >= wake_at and wake_at != self._rung_for:
            self._rung_for = wake_at
            self._ring_peer()

    def _has_message(self) -> bool:
        """A message is there to take; raises if none ever will be."""
        return self._head != self._tail_seen or self._refresh_tail()

    def _wait_for_data(self, timeout: float | None) -> None:
        """Return once a message is there; raise if none will come or `timeout` passes."""
        self._check_open()
        if self._has_message():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._refresh_tail():
            if deadline is None:
                self._sleep(-1.0)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no message within {timeout} s")
            self._sleep(remaining)

    def _sleep(self, timeout: float) -> None:
        if self._arm():
            self.waits += 1
            events = self._epoll.poll(timeout)
            self._disarm()
            self._collect(events)

    def close(self) -> None:
        """Stop receiving: the sender's next send raises RingClosedError."""
        if self._closed:
            return
        self._closed = True
        self._w[_W_CONSUMER_CLOSED] = 1
        # A new sleeping epoch makes the sender's per-message check notice the close.
        self._w[_W_CONSUMER_SLEEPING] = self._next_epoch()
        self._ring_peer()

    def _refresh_tail(self) -> bool:
        """Slow path: re-read the tail; False if still empty; raise if it will stay empty."""
        tail = self._q[_Q_TAIL]
        head = self._head
        if not (0 <= tail - head <= self._cap) or tail % 8:
            raise RingCorruptError(f"producer tail {tail} is inconsistent with head {head}")
        self._tail_seen = tail
        if tail != head:
            return True
        if self._w[_W_PRODUCER_CLOSED] or self._peer_dead:
            # The close flag (or the exit) comes after the last publish: look once more.
            if self._q[_Q_TAIL] != head:
                return self._refresh_tail()
            if self._w[_W_PRODUCER_CLOSED]:
                raise RingClosedError("the sender closed its end of the ring")
            raise PeerDiedError("the sending process exited")
        return False

    def _arm(self) -> bool:
        """Announce that we sleep; False if data (or a reason to stop) came meanwhile."""
        self._check_open()
        self._w[_W_CONSUMER_SLEEPING] = self._next_epoch()
        self._slow_fence()
        if self._q[_Q_TAIL] != self._head or self._w[_W_PRODUCER_CLOSED] or self._peer_dead:
            self._disarm()
            return False
        return True

    def _next_epoch(self) -> int:
        self._epoch = self._epoch % 0xFFFFFFFF + 1
        return self._epoch

    def _disarm(self) -> None:
        if not self._closed:  # a closed receiver keeps the flag up (see close)
            self._w[_W_CONSUMER_SLEEPING] = 0

    def _join_wrapped(self, body: int, end: int) -> bytes:
        """A payload that wraps, copied out once into one allocation."""
        view = self._bytes_view
        return b"".join((view[body : self._data_end], view[_OFF_DATA : end - self._cap]))

    def _corrupt(self, head: int, header: int) -> RingCorruptError:
        return RingCorruptError(
            f"bad record header at position {head} (offset {head % self._cap}): length "
            f"{header & _LENGTH_MASK}, type {header >> 32:#x}; "
            f"{self._tail_seen - head} bytes were published"
        )


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
    async def turn(
        self,
        endpoint: RingSender | RingReceiver,
        ready: Callable[[], bool],
        arm: Callable[[], bool],
    ) -> AsyncIterator[None]:
        """Wait for this task's turn, then sleep on the doorbell until `ready()`. The body runs
        in the turn with no await between the last `ready()` and it, so what it does to the ring
        happens in one synchronous step: a task cancelled here has changed nothing.
        `arm()` asks the peer to ring and says whether it will (False: look again now)."""
        self.waiting += 1
        try:
            async with self.lock():
                while not ready():
                    if arm():
                        endpoint.waits += 1
                        try:
                            await anyio.wait_readable(endpoint._wait_fd())
                        finally:
                            endpoint._disarm()
                        endpoint._collect(endpoint._epoll.poll(0))
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

    def send_nowait(self, payload: bytes | bytearray | memoryview) -> None:
        if self._queue.waiting:
            raise anyio.WouldBlock  # others wait for room already
        self.sync.send_nowait(payload)

    async def send(self, payload: bytes | bytearray | memoryview) -> None:
        await anyio.lowlevel.checkpoint_if_cancelled()
        sender = self.sync
        if sender._stop:
            sender._raise_if_unusable()
        if type(payload) is not bytes:
            payload = _byte_view(payload)
        size = (len(payload) + 15) & -8
        if self._queue.waiting or (
            sender._tail + size - sender._head_seen > sender._cap and not sender._room_for(size)
        ):
            room = functools.partial(sender._room_for, size)
            async with self._queue.turn(sender, room, functools.partial(sender._arm, size)):
                sender.send_nowait(payload)
        else:
            sender.send_nowait(payload)
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
        return await self._take(RingReceiver.receive_nowait)

    async def receive_batch(self, max_messages: int | None = None) -> list[bytes]:
        """Wait for at least one message, then take all available (at most `max_messages`)."""
        return await self._take(lambda receiver: receiver.receive_all_nowait(max_messages))

    async def _take(self, take: Callable[[RingReceiver], _T]) -> _T:
        """Wait (in FIFO order with other tasks) until a message is there, then `take` it."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        receiver = self.sync
        receiver._check_open()
        if self._queue.waiting or not receiver._has_message():
            async with self._queue.turn(receiver, receiver._has_message, receiver._arm):
                result = take(receiver)
        else:
            result = take(receiver)
        await anyio.lowlevel.cancel_shielded_checkpoint()
        return result

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.receive()
        except PeerDiedError:
            raise
        except RingClosedError:
            raise StopAsyncIteration from None
