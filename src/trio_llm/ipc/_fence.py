"""Memory ordering: the x86-64 assumption, and the two ways to get a StoreLoad fence from Python.

Owns the platform check and the fence a ring's endpoints use, chosen once per ring (by `create`,
recorded in the preamble, honoured by `attach`). Invariant: a ring exists only on x86-64; on any
other machine `create` and `attach` raise `RingError` instead of running without fences.

CPython reads and writes shared memory with plain loads and stores (memoryview items, slice
copies). That is correct on x86-64 only: under TSO stores become visible in program order and
loads are not reordered with other loads, so a consumer that sees a tail also sees the record
before it, and a producer that sees a head sees that the consumer is done with the bytes before
it. Other architectures would need real fences, which Python cannot issue.

The doorbell protocol (`_endpoint`) is Dekker's pattern and needs a StoreLoad fence on both
sides, the one reordering x86 does allow (a store can wait in the store buffer while a later load
completes). The two modes:

- "lock" (the default): acquiring and releasing an uncontended `threading.Lock` executes a
  LOCK-prefixed read-modify-write inside libc (`sem_trywait`/`sem_post` on CPython 3.11, an
  atomic compare-exchange in 3.13's `PyMutex`), which is a full fence on x86; the C compiler
  cannot move the surrounding stores across the opaque calls either. Both sides pay it on every
  message, about 0.2 us here: the hot paths inline `lock.acquire(); lock.release()`.
- "membarrier": the asymmetric form. The side about to sleep calls
  membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), and the kernel makes every running thread of every
  registered process (ours register when a ring is created or attached) execute a full barrier;
  wherever the peer's barrier lands (before its position store, between store and flag load, or
  after the load), one side sees the other's store. The hot path then needs no fence, but each
  sleep costs an IPI to the other CPUs, which in a VM under load took tens of microseconds
  (bench/results/ipc.md), so it is the choice for dedicated cores only.

The two-process stress test (a million messages through a small ring, random pauses on both
sides, in both fence modes) exercises this; it cannot prove the fences necessary (with them
removed it still passed three runs out of three here: the race window is a few store-buffer
drains wide), only that the protocol loses nothing with them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import threading
from collections.abc import Callable
from typing import NamedTuple

from trio_llm.ipc._errors import RingError
from trio_llm.ipc._layout import FENCE_CODES

_NR_MEMBARRIER = 324  # x86-64
_MEMBARRIER_CMD_GLOBAL_EXPEDITED = 1 << 1
_MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED = 1 << 2


def check_platform() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise RingError(
            f"the shared-memory ring relies on x86-64 store ordering (TSO) and has no fences for "
            f"{platform.machine()!r}; refusing to run rather than corrupt messages"
        )


def check_fence(fence: str, *, created: bool) -> None:
    """Raise unless this process can use `fence` (for a ring it creates, or attaches to)."""
    if fence not in FENCE_CODES:
        raise ValueError(f"fence must be 'lock' or 'membarrier', got {fence!r}")
    if fence == "membarrier" and _membarrier() is None:
        if created:
            raise RingError("membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) is not available here")
        raise RingError(
            "the ring was created with membarrier fences, which this process cannot use"
        )


class Fences(NamedTuple):
    """What one endpoint fences with."""

    hot: threading.Lock | None
    """Acquired and released on every message (lock mode); None when the hot path needs none."""
    slow: Callable[[], None]
    """Called by a side about to sleep, between announcing the sleep and looking once more."""


def fences(fence: str) -> Fences:
    """A fresh pair for one endpoint of a ring whose mode `check_fence` accepted."""
    if fence == "membarrier":
        barrier = _membarrier()
        assert barrier is not None  # check_fence ran when the ring was created or attached
        return Fences(None, barrier)
    lock = threading.Lock()
    acquire, release = lock.acquire, lock.release

    def lock_fence() -> None:
        acquire()
        release()

    return Fences(lock, lock_fence)


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
