"""The shared memory and the doorbells of one ring: created by the parent, inherited by the child.

Owns the segment's life outside the protocol: an anonymous memfd of `segment_size(capacity)`
bytes, sealed against resizing, and two eventfds, all close-on-exec, so that only a child given
them in `subprocess`'s `pass_fds` inherits them (under the same numbers, named by `RingSpec`).

Nothing is ever named in /dev/shm, so there is nothing to unlink and no file mode to get right:
the memfd is reachable only through its fds (or /proc/PID/fd, which takes the right to ptrace
the process), and the kernel frees the memory when the last fd and the last mapping go, whatever
way either process ends. The sealing means neither side can shrink the segment under the other's
mapping (which would turn a read into SIGBUS instead of a `RingCorruptError`).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import secrets
import weakref

import msgspec

from trio_llm.ipc._errors import RingCorruptError, RingError
from trio_llm.ipc._fence import check_fence, check_platform
from trio_llm.ipc._layout import check_capacity, read_preamble, segment_size, write_preamble

__all__ = ["MappedSegment", "RingSpec", "attach_segment", "close_fds", "create_segment"]


class RingSpec(msgspec.Struct, frozen=True, array_like=True):
    """What a child needs to attach: the inherited fd numbers and the capacity."""

    mem_fd: int
    data_fd: int
    """eventfd: the producer rings it when the consumer sleeps on an empty ring."""
    space_fd: int
    """eventfd: the consumer rings it when the producer waits on a full ring."""
    capacity: int


class MappedSegment:
    """A ring's segment as this process maps it: what both of its ends read and write (the
    memory and its views, the doorbells, the fence mode), and nothing else of the ring.

    It owns this process's fds of the ring (and the peer's pidfd once watched): they close when
    it is released, or when it is garbage-collected, so an endpoint holding it keeps them open
    however long it outlives its `ShmRing`.
    """

    __slots__ = ("__weakref__", "_finalizer", "bytes_view", "fence", "mem", "q", "spec", "w")

    def __init__(self, spec: RingSpec, mem: mmap.mmap, fence: str) -> None:
        self.spec = spec
        self.mem = mem
        self.fence = fence
        view = memoryview(mem)
        self.bytes_view = view
        self.q = view.cast("Q")
        """The header's 64-bit words (`_layout.Q_*`) and the records' headers."""
        self.w = view.cast("I")
        """The header's 32-bit words (`_layout.W_*`)."""
        self._finalizer = weakref.finalize(self, close_fds, [*self.fds])

    @property
    def capacity(self) -> int:
        return self.spec.capacity

    @property
    def fds(self) -> tuple[int, ...]:
        return (self.spec.mem_fd, self.spec.data_fd, self.spec.space_fd)

    def adopt(self, fd: int) -> None:
        """Close `fd` (the peer's pidfd) with the segment's own fds."""
        _, _, (fds,), _ = self._finalizer.detach()  # type: ignore[misc]
        self._finalizer = weakref.finalize(self, close_fds, [*fds, fd])

    def unmap(self) -> None:
        """Release the views and the mapping (once the endpoints have released the views they
        sliced from these)."""
        for view in (self.w, self.q, self.bytes_view):
            view.release()
        self.mem.close()

    def close_fds(self) -> None:
        """Idempotent; also what garbage collection runs."""
        self._finalizer()


def create_segment(capacity: int, fence: str) -> tuple[RingSpec, mmap.mmap]:
    """A fresh segment with its preamble written, and its doorbells."""
    check_platform()
    check_capacity(capacity)
    check_fence(fence, created=True)
    fds: list[int] = []
    try:
        # CLOEXEC: only a child given the fds in pass_fds inherits them.
        mem_fd = os.memfd_create(
            f"trio-llm-ring-{os.getpid()}-{secrets.token_hex(8)}",
            os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING,
        )
        fds.append(mem_fd)
        os.ftruncate(mem_fd, segment_size(capacity))
        fcntl.fcntl(
            mem_fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        )
        data_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        fds.append(data_fd)
        space_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        fds.append(space_fd)
        mem = mmap.mmap(mem_fd, segment_size(capacity))
    except BaseException:
        close_fds(fds)
        raise
    write_preamble(mem, capacity, fence)
    return RingSpec(mem_fd, data_fd, space_fd, capacity), mem


def attach_segment(spec: RingSpec) -> tuple[mmap.mmap, str]:
    """Map a segment created by the parent, from fds inherited under the same numbers; its fence.

    Checks the segment before trusting it: its size, its preamble, and that this process can use
    the fence mode it was created with.
    """
    check_platform()
    for fd in (spec.mem_fd, spec.data_fd, spec.space_fd):
        try:
            os.fstat(fd)
        except OSError as exc:
            raise RingError(
                f"fd {fd} of {spec} is not open here: the parent must pass ring.fds "
                f"to the child (subprocess pass_fds=)"
            ) from exc
    size = os.fstat(spec.mem_fd).st_size
    if size != segment_size(spec.capacity):
        raise RingCorruptError(
            f"segment is {size} bytes, expected {segment_size(spec.capacity)} for {spec}"
        )
    mem = mmap.mmap(spec.mem_fd, size)
    try:
        fence = read_preamble(mem, spec.capacity)
        check_fence(fence, created=False)
    except BaseException:
        mem.close()
        raise
    return mem, fence


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
