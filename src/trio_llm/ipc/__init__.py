"""Frontend<->engine IPC: the shared-memory ring, the wire messages and their codec.

The public surface is this file; the ring lives in private modules, one concept each:
`_layout` (the bytes of a segment), `_segment` (memfd and eventfds: creation, inheritance),
`_fence` (the x86-64 memory-ordering assumption and the fences), `_endpoint` (the doorbell
protocol and the blocking loop), `_sender` and `_receiver` (the two ends, blocking face, each with
the one fast path every face uses), `_async` (their AnyIO faces) and `_ring` (`ShmRing`, which
ties a segment to this process's endpoints). `messages` and `codec` are public modules.
"""

from anyio import WouldBlock

from trio_llm.ipc._async import AsyncRingReceiver, AsyncRingSender
from trio_llm.ipc._errors import (
    MessageTooLargeError,
    PeerDiedError,
    RingClosedError,
    RingCorruptError,
    RingError,
)
from trio_llm.ipc._receiver import RingReceiver
from trio_llm.ipc._ring import RingStatistics, ShmRing
from trio_llm.ipc._segment import RingSpec
from trio_llm.ipc._sender import RingSender
from trio_llm.ipc.codec import (
    DecodeError,
    decode_engine_message,
    decode_frontend_message,
    encode,
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
