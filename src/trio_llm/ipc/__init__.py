"""Frontend<->engine IPC: the shared-memory ring, the wire messages and their codec."""

from anyio import WouldBlock

from trio_llm.ipc.codec import (
    DecodeError,
    decode_engine_message,
    decode_frontend_message,
    encode,
)
from trio_llm.ipc.shm_ring import (
    AsyncRingReceiver,
    AsyncRingSender,
    MessageTooLargeError,
    PeerDiedError,
    RingClosedError,
    RingCorruptError,
    RingError,
    RingReceiver,
    RingSender,
    RingSpec,
    RingStatistics,
    ShmRing,
)

__all__ = [
    "AsyncRingReceiver",
    "AsyncRingSender",
    "DecodeError",
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
    "WouldBlock",
    "decode_engine_message",
    "decode_frontend_message",
    "encode",
]
