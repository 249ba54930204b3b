"""The ring's errors: one type per fault, raised where the fault is known.

A receiver sees `RingClosedError` only after it has drained every message sent before the close,
so a clean end of stream and a lost message can never look alike.
"""

from __future__ import annotations

__all__ = [
    "MessageTooLargeError",
    "PeerDiedError",
    "RingClosedError",
    "RingCorruptError",
    "RingError",
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
