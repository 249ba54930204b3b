"""Frontend<->engine IPC: the shared-memory ring, the wire messages and their codec.

Three public modules: `shm_ring` (the ring's public face: `ShmRing`, its ends in both faces,
its statistics and errors), `messages` (the typed messages that cross the rings) and `codec`
(their msgpack encoding); this file re-exports them. The ring's machinery lives in private
modules beside `shm_ring`, one concept each: `_layout` (the bytes of a segment), `_segment`
(memfd and eventfds: creation, inheritance, this process's mapping), `_fence` (the x86-64
memory-ordering assumption and the fences), `_endpoint` (the doorbell protocol and the blocking
loop), `_sender` and `_receiver` (the two ends, blocking face, each with the one fast path every
face uses) and `_async` (their AnyIO faces).
"""

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
