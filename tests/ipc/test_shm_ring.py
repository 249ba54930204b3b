"""The ring within one process: layout edge cases, backpressure, closing, corruption."""

from __future__ import annotations

import array
import gc
import mmap
import os
import re
import threading

import anyio
import msgspec
import pytest

from trio_llm.ipc import (
    MessageTooLargeError,
    PeerDiedError,
    RingClosedError,
    RingCorruptError,
    RingError,
    RingSpec,
    ShmRing,
    WouldBlock,
    _fence,
    _layout,
    encode,
)


def move_to_offset(ring: ShmRing, offset: int) -> None:
    """Send and receive one filler record so that the next record starts at `offset`."""
    tx, rx = ring.sender(), ring.receiver()
    used = tx._tail % ring.capacity
    gap = (offset - used) % ring.capacity
    if gap:
        tx.send_nowait(b"f" * (gap - 8))
        rx.receive_nowait()
    assert tx._tail % ring.capacity == offset


def test_round_trip_of_bytes_like_payloads(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"bytes")
    tx.send_nowait(bytearray(b"bytearray"))
    tx.send_nowait(memoryview(b"xxviewxx")[2:6])
    tx.send_nowait(array.array("i", [1, 2, 3]))  # a multi-byte format goes as its raw bytes
    assert rx.receive_nowait() == b"bytes"
    assert rx.receive_nowait() == b"bytearray"
    assert rx.receive_nowait() == b"view"
    assert rx.receive_nowait() == array.array("i", [1, 2, 3]).tobytes()
    with pytest.raises(WouldBlock):
        rx.receive_nowait()


def test_every_size_at_every_offset() -> None:
    capacity = 128
    with ShmRing.create(capacity) as ring:
        tx, rx = ring.sender(), ring.receiver()
        for size in range(capacity - 8 + 1):
            payload = bytes((size + i) % 251 for i in range(size))
            for offset in range(0, capacity, 8):
                move_to_offset(ring, offset)
                tx.send_nowait(payload)
                assert rx.receive_nowait() == payload
                assert ring.statistics().bytes_used == 0


def test_exact_fit_fills_the_ring_at_any_offset() -> None:
    with ShmRing.create(64) as ring:
        tx, rx = ring.sender(), ring.receiver()
        for offset in (0, 8, 24, 56):
            move_to_offset(ring, offset)
            tx.send_nowait(b"a" * 20)  # 32 bytes
            tx.send_nowait(b"b" * 24)  # 32 more: exactly full
            assert ring.statistics().bytes_used == 64
            with pytest.raises(WouldBlock):
                tx.send_nowait(b"")
            assert rx.receive_nowait() == b"a" * 20
            tx.send_nowait(b"c" * 17)  # fits again, in the 32 bytes just freed
            assert rx.receive_nowait() == b"b" * 24
            assert rx.receive_nowait() == b"c" * 17


def test_empty_messages_are_messages(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    for _ in range(100):
        tx.send_nowait(b"")
        tx.send_nowait(b"")
        assert rx.receive_all_nowait() == [b"", b""]


def test_largest_message_fits_an_empty_ring_at_any_offset() -> None:
    with ShmRing.create(64) as ring:
        tx, rx = ring.sender(), ring.receiver()
        assert tx.max_message_size == 56
        for offset in range(0, 64, 8):
            move_to_offset(ring, offset)
            payload = os.urandom(56)
            tx.send_nowait(payload)
            assert ring.statistics().bytes_used == 64
            assert rx.receive_nowait() == payload


def test_oversize_is_refused_and_leaves_the_ring_untouched(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"before")
    with pytest.raises(MessageTooLargeError, match="can never fit") as exc_info:
        tx.send_nowait(b"x" * (ring.capacity - 7))
    assert isinstance(exc_info.value, ValueError)
    with pytest.raises(MessageTooLargeError):
        tx.send(b"x" * (ring.capacity * 2), timeout=0)  # refused, not waited for
    tx.send_nowait(b"after")
    assert rx.receive_all_nowait() == [b"before", b"after"]


def test_full_ring_blocks_then_resumes(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    sent: list[bytes] = []
    while True:
        payload = str(len(sent)).encode() * 5
        try:
            tx.send_nowait(payload)
        except WouldBlock:
            break
        sent.append(payload)
    with pytest.raises(TimeoutError):
        tx.send(b"late", timeout=0.05)

    done = threading.Event()

    def send_late() -> None:
        tx.send(b"late")
        done.set()

    thread = threading.Thread(target=send_late)
    thread.start()
    assert not done.wait(0.05)  # still blocked: the ring is full
    received = [rx.receive(timeout=5)]
    while len(received) < len(sent) + 1:
        received.append(rx.receive(timeout=5))
    thread.join(5)
    assert done.is_set()
    assert received == [*sent, b"late"]
    assert ring.statistics().waits >= 1


def test_receive_waits_for_data_and_times_out(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    with pytest.raises(WouldBlock):
        rx.receive_nowait()
    with pytest.raises(TimeoutError):
        rx.receive(timeout=0.02)
    timer = threading.Timer(0.05, tx.send, args=(b"wake",))
    timer.start()
    assert rx.receive(timeout=5) == b"wake"
    timer.join()


def test_receive_all_nowait_takes_a_batch(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    assert rx.receive_all_nowait() == []
    for i in range(10):
        tx.send_nowait(bytes([i]))
    assert rx.receive_all_nowait(max_messages=3) == [b"\0", b"\1", b"\2"]
    assert rx.receive_all_nowait() == [bytes([i]) for i in range(3, 10)]
    assert ring.statistics().messages_received == 10


def test_sender_close_drains_then_raises(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"one")
    tx.send_nowait(b"two")
    tx.close()
    tx.close()  # idempotent
    assert rx.receive(timeout=1) == b"one"
    assert rx.receive_all_nowait() == [b"two"]
    with pytest.raises(RingClosedError):
        rx.receive_nowait()
    with pytest.raises(RingClosedError):
        rx.receive(timeout=1)
    with pytest.raises(RingClosedError):
        rx.receive_all_nowait()
    with pytest.raises(anyio.ClosedResourceError):
        tx.send_nowait(b"three")


def test_receiver_close_stops_the_sender(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"one")
    rx.close()
    tx.send_nowait(b"racing the close")  # dropped: nobody will read it
    with pytest.raises(RingClosedError):
        tx.send_nowait(b"after the close")
    with pytest.raises(anyio.ClosedResourceError):
        rx.receive_nowait()
    assert ring.statistics().receiver_closed


def test_receiver_close_wakes_a_blocked_sender(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    while True:
        try:
            tx.send_nowait(b"x" * 40)
        except WouldBlock:
            break
    timer = threading.Timer(0.05, rx.close)
    timer.start()
    with pytest.raises(RingClosedError):
        tx.send(b"x" * 40, timeout=5)
    timer.join()


def test_close_is_idempotent_and_ends_use(fence: str) -> None:
    ring = ShmRing.create(64, fence=fence)  # type: ignore[arg-type]
    tx = ring.sender()
    fds = ring.fds
    with ring:
        pass
    ring.close()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    with pytest.raises(anyio.ClosedResourceError):
        tx.send_nowait(b"x")
    with pytest.raises(anyio.ClosedResourceError):
        ring.receiver()
    assert "closed" in repr(ring)


def test_endpoints_are_one_per_side(ring: ShmRing) -> None:
    assert ring.sender() is ring.sender()
    assert ring.receiver() is ring.receiver()
    assert ring.async_sender().sync is ring.sender()


def test_statistics(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"12345")
    tx.send_nowait(b"")
    stats = ring.statistics()
    assert (stats.capacity, stats.bytes_used, stats.messages_sent) == (256, 24, 2)
    rx.receive_nowait()
    stats = ring.statistics()
    assert (stats.bytes_used, stats.messages_received) == (8, 1)
    assert not stats.sender_closed and not stats.receiver_closed


@pytest.mark.parametrize("capacity", [0, 8, 100, 2**32 + 8])
def test_capacity_is_validated(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        ShmRing.create(capacity)


def test_other_architectures_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fence.platform, "machine", lambda: "aarch64")
    with pytest.raises(RingError, match="x86-64"):
        ShmRing.create(64)


def test_watching_a_process_that_is_gone(ring: ShmRing) -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    rx = ring.receiver()
    ring.watch_peer(pid)
    with pytest.raises(PeerDiedError):
        rx.receive(timeout=5)
    with pytest.raises(PeerDiedError):
        ring.sender().send_nowait(b"x")


# -- corruption: whatever a peer scribbles, the reader raises and never reads out of bounds ---


def scribble(ring: ShmRing, offset: int, data: bytes) -> None:
    """Write into the segment through a mapping of our own, as a misbehaving peer would."""
    with mmap.mmap(ring.spec.mem_fd, 0) as mem:
        mem[offset : offset + len(data)] = data


DATA = _layout.OFF_DATA


@pytest.mark.parametrize(
    "garbage",
    [
        (1000).to_bytes(4, "little") + _layout.RECORD_MESSAGE.to_bytes(4, "little"),
        (5).to_bytes(4, "little") + (7).to_bytes(4, "little"),  # unknown type
        b"\xff" * 8,
    ],
    ids=["length-past-tail", "unknown-type", "all-ones"],
)
def test_corrupt_record_header_raises(ring: ShmRing, garbage: bytes) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"hello")
    scribble(ring, DATA, garbage)
    with pytest.raises(RingCorruptError, match="bad record header"):
        rx.receive_nowait()
    with pytest.raises(RingCorruptError):
        rx.receive_all_nowait()
    with pytest.raises(RingCorruptError):  # and it stays broken: nothing was consumed
        rx.receive(timeout=1)


def test_receive_all_hands_over_good_records_before_a_bad_one(ring: ShmRing) -> None:
    tx, rx = ring.sender(), ring.receiver()
    tx.send_nowait(b"good")  # 16 bytes
    tx.send_nowait(b"bad")
    scribble(ring, DATA + 16, b"\xff" * 8)
    assert rx.receive_all_nowait() == [b"good"]
    with pytest.raises(RingCorruptError):
        rx.receive_all_nowait()


def test_corrupt_tail_raises(ring: ShmRing) -> None:
    rx = ring.receiver()
    scribble(ring, _layout.OFF_TAIL, (10**6).to_bytes(8, "little"))
    with pytest.raises(RingCorruptError, match="tail"):
        rx.receive_nowait()


def test_corrupt_head_raises_in_the_sender(ring: ShmRing) -> None:
    tx = ring.sender()
    tx.send_nowait(b"x" * 248)  # full: the next send needs a fresh look at the head
    scribble(ring, _layout.OFF_HEAD, (10**6).to_bytes(8, "little"))
    with pytest.raises(RingCorruptError, match="head"):
        tx.send_nowait(b"")


def test_attach_checks_the_segment(ring: ShmRing) -> None:
    scribble(ring, 0, b"notaring")
    with pytest.raises(RingCorruptError, match="preamble"):
        ShmRing.attach(ring.spec)
    wrong_size = RingSpec(ring.spec.mem_fd, ring.spec.data_fd, ring.spec.space_fd, 512)
    with pytest.raises(RingCorruptError, match="bytes"):
        ShmRing.attach(wrong_size)


def test_attach_explains_missing_fds() -> None:
    with pytest.raises(RingError, match="pass_fds"):
        ShmRing.attach(RingSpec(1_000_000, 1_000_001, 1_000_002, 64))


def test_an_endpoint_keeps_its_ring_alive() -> None:
    rx = ShmRing.create(64).receiver()  # nothing else refers to the ring
    gc.collect()
    with pytest.raises(TimeoutError):
        rx.receive(timeout=0.01)  # its doorbell fd is still open


# -- what a receive hands out: copies, so the ring may reuse the space and close() frees all ----


def test_received_messages_outlive_their_space_and_close_frees_everything(fence: str) -> None:
    """Every receive path, a decoder that keeps slices of what it got, many laps of the ring.

    The removed in-place path (`receive_decoded`) failed both halves: a slice kept from its view
    read what the producer wrote later, and close() then could not unmap and leaked the fds.
    """
    ring = ShmRing.create(256, fence=fence)  # type: ignore[arg-type]
    tx, arx = ring.sender(), ring.async_receiver()
    rx = arx.sync
    memfd = os.readlink(f"/proc/self/fd/{ring.spec.mem_fd}").removesuffix(" (deleted)")
    assert memfd in _own_mappings()

    async def receive_async() -> list[bytes]:
        return [await arx.receive(), *await arx.receive_batch()]

    receive_paths = [
        lambda: [rx.receive(timeout=1)],
        lambda: [rx.receive_nowait()],
        rx.receive_all_nowait,
        lambda: anyio.run(receive_async),
    ]
    kept: list[tuple[bytes, msgspec.Raw]] = []
    for lap in range(200):  # about 40 laps of the ring, records at every offset
        sent = [encode([lap, i, "x" * (lap % 50)]) for i in range(2)]
        for message in sent:
            tx.send_nowait(message)
        got: list[bytes] = []
        while len(got) < len(sent):
            got += receive_paths[lap % len(receive_paths)]()
        assert got == sent
        for message in got:
            assert type(message) is bytes
            # A Raw points into the buffer it was decoded from, as a zero-copy decoder would.
            kept.append((message, msgspec.msgpack.decode(message, type=msgspec.Raw)))
    assert all(bytes(raw) == message for message, raw in kept)

    fds = ring.fds
    ring.close()
    assert all(bytes(raw) == message for message, raw in kept)
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)
    assert memfd not in _own_mappings()


def _own_mappings() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


def test_the_layout_docstring_gives_the_offsets_the_code_uses() -> None:
    table = re.findall(r"^    (\d+)\s+(\d+)\s+([a-z_]+)\s", _layout.__doc__ or "", re.M)
    documented = {field: (int(offset), int(size)) for offset, size, field in table}
    assert documented == {
        "preamble": (0, _layout.PREAMBLE.size),
        "tail": (_layout.Q_TAIL * 8, 8),
        "producer_closed": (_layout.W_PRODUCER_CLOSED * 4, 4),
        "wake_at": (_layout.Q_PRODUCER_WAKE_AT * 8, 8),
        "head": (_layout.Q_HEAD * 8, 8),
        "consumer_closed": (_layout.W_CONSUMER_CLOSED * 4, 4),
        "consumer_sleeping": (_layout.W_CONSUMER_SLEEPING * 4, 4),
    }
    assert re.search(rf"^    {_layout.OFF_DATA}\s+cap\s+data\s", _layout.__doc__ or "", re.M)
