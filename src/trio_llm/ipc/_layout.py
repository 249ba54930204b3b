"""The bytes of a ring segment: where every field lives, and what a record looks like.

Owns the segment's layout (the offsets below, as byte offsets and as indices into u64 and u32
views), the preamble, the record format and the one error a bad record raises. It does not parse
records: that happens in exactly one place, `RingReceiver._record`, which every receive goes
through; the one writer of records is `RingSender.try_send`.

Segment layout (little-endian; every field after the preamble is written by one side only):

    offset  bytes  field               written by
    0       28     preamble            `create`, once: magic u64, version u32, record type u32,
                                       capacity u64, fence code u32 (`PREAMBLE`)
    128     8      tail                the producer, per message: u64 byte position
    256     4      producer_closed     the producer, when it closes: u32 0 or 1
    260     4      (unused)
    264     8      wake_at             the producer, around a wait on a full ring: the u64 head
                                       position at which to ring it; 0 when it does not wait
    384     8      head                the consumer, per message or batch: u64 byte position
    512     4      consumer_closed     the consumer, when it closes: u32 0 or 1
    516     4      consumer_sleeping   the consumer, around a wait on an empty ring: u32 epoch
                                       of the sleep; 0 when awake (kept up once closed)
    1024    cap    data                records: [u32 length][u32 type][payload], 8-byte aligned

The positions, written on every message, and the flags, written only around sleeps and closes
but read on every message by the other side, live 128 bytes apart (a cache line and its prefetch
buddy), so the per-message reads never pull a line the other side keeps writing.

`head` and `tail` are monotonic byte positions (never wrapped; 2**64 bytes is out of reach), so
`tail - head` is the number of bytes in use and `position % capacity` the offset of a record.
A record takes `record_size(length)` bytes: the 8-byte header and the payload, rounded up to 8.
Its header is always contiguous (offsets and capacity are multiples of 8) and is written with one
aligned 8-byte store (`length | RECORD_TYPE_BITS`); its payload may wrap around the end of the
data area and continue at its start. That deviates from the padding-record layout of the design
notes on purpose: with padding, a message larger than about half the ring finds no contiguous
room even in an empty ring whose head sits mid-way, and would wait forever; here any message up
to `capacity - 8` bytes fits once the ring has drained, at every offset. The receiver copies the
payload out either way, so contiguity would buy nothing.

Invariants:
- 0 <= tail - head <= capacity, both multiples of 8. The producer alone writes the data between
  tail and head + capacity; the consumer only reads the data between head and tail. A reader
  validates everything it reads from the other side (positions, record length and type) and
  raises `RingCorruptError` rather than read out of bounds; the segment's size is sealed
  (`_segment`), so a peer cannot shrink it under our mapping either.
- A message is published by writing its payload, then its header, then the tail. Space is
  returned by writing the head after the payload was copied out. (That this order is the order
  the other side sees is the x86-64 assumption of `_fence`.)
"""

from __future__ import annotations

import mmap
import struct

from trio_llm.ipc._errors import RingCorruptError

MAGIC = int.from_bytes(b"trioRNG\x01", "little")
VERSION = 1
RECORD_MESSAGE = 0x3147534D  # b"MSG1": the only record type
RECORD_TYPE_BITS = RECORD_MESSAGE << 32  # a header as one u64: length | type << 32
LENGTH_MASK = 0xFFFFFFFF
HEADER_BYTES = 8
PREAMBLE = struct.Struct("<QIIQI")  # magic, version, record type, capacity, fence code
FENCE_CODES = {"membarrier": 1, "lock": 2}
"""How the preamble records the ring's fence mode (`_fence`)."""

OFF_TAIL = 128
OFF_PRODUCER_FLAGS = 256  # closed u32 | unused u32 | wake_at u64
OFF_HEAD = 384
OFF_CONSUMER_FLAGS = 512  # closed u32 | sleeping u32
OFF_DATA = 1024
OFF_BODY = OFF_DATA + HEADER_BYTES  # where the payload of a record at data offset 0 starts

# The same offsets as indices into the u64 (Q_*) and u32 (W_*) views of the segment.
Q_TAIL = OFF_TAIL // 8
W_PRODUCER_CLOSED = OFF_PRODUCER_FLAGS // 4
Q_PRODUCER_WAKE_AT = OFF_PRODUCER_FLAGS // 8 + 1
Q_HEAD = OFF_HEAD // 8
W_CONSUMER_CLOSED = OFF_CONSUMER_FLAGS // 4
W_CONSUMER_SLEEPING = OFF_CONSUMER_FLAGS // 4 + 1
Q_DATA = OFF_DATA // 8

MIN_CAPACITY = 16
MAX_CAPACITY = 1 << 32  # a record length is a u32


def record_size(length: int) -> int:
    """Bytes a record of a `length`-byte payload takes: header and payload, rounded up to 8.

    The hot paths of both ends inline it as `(length + 15) & -8`.
    """
    return (length + HEADER_BYTES + 7) & -8


def segment_size(capacity: int) -> int:
    return OFF_DATA + capacity


def check_capacity(capacity: int) -> None:
    if not (MIN_CAPACITY <= capacity <= MAX_CAPACITY) or capacity % 8:
        raise ValueError(
            f"capacity must be a multiple of 8 between {MIN_CAPACITY} and {MAX_CAPACITY}, "
            f"got {capacity}"
        )


def write_preamble(mem: mmap.mmap, capacity: int, fence: str) -> None:
    PREAMBLE.pack_into(mem, 0, MAGIC, VERSION, RECORD_MESSAGE, capacity, FENCE_CODES[fence])


def read_preamble(mem: mmap.mmap, capacity: int) -> str:
    """The fence mode of a segment that must hold a ring of `capacity`; raises if it does not."""
    magic, version, record_type, found, code = PREAMBLE.unpack_from(mem, 0)
    fence = {v: k for k, v in FENCE_CODES.items()}.get(code)
    if (magic, version, record_type, found) != (MAGIC, VERSION, RECORD_MESSAGE, capacity) or (
        fence is None
    ):
        raise RingCorruptError(
            f"segment preamble (magic {magic:#x}, version {version}, capacity {found}, "
            f"fence mode {code}) does not match a version {VERSION} ring of capacity {capacity}"
        )
    return fence


def bad_record(head: int, header: int, capacity: int, published: int) -> RingCorruptError:
    """The error for a record header at position `head` that the protocol never writes."""
    return RingCorruptError(
        f"bad record header at position {head} (offset {head % capacity}): length "
        f"{header & LENGTH_MASK}, type {header >> 32:#x}; {published} bytes were published"
    )
