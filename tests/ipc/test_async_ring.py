"""The AnyIO face, on Trio and on asyncio: waiting, backpressure, cancellation consistency."""

from __future__ import annotations

import random
import threading

import anyio
import pytest
import sniffio

from trio_llm.ipc import (
    AsyncRingReceiver,
    RingClosedError,
    ShmRing,
    WouldBlock,
)

pytestmark = pytest.mark.anyio


async def test_runs_on_the_requested_backend(anyio_backend: str) -> None:
    assert sniffio.current_async_library() == anyio_backend


async def test_send_receive_and_iteration(ring: ShmRing) -> None:
    tx, rx = ring.async_sender(), ring.async_receiver()
    received: list[bytes] = []

    async def consume() -> None:
        async for message in rx:
            received.append(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        for i in range(200):  # several laps of the ring, with the consumer sleeping between
            await tx.send(str(i).encode() * 7)
        await tx.aclose()
    assert received == [str(i).encode() * 7 for i in range(200)]


async def test_receive_waits_for_a_message(ring: ShmRing) -> None:
    tx, rx = ring.async_sender(), ring.async_receiver()
    got: list[bytes] = []

    async def receive_one() -> None:
        got.append(await rx.receive())

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive_one)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        tx.send_nowait(b"hello")
    assert got == [b"hello"]


async def test_full_ring_blocks_the_sender_then_resumes(ring: ShmRing) -> None:
    tx, rx = ring.async_sender(), ring.async_receiver()
    sent = 0
    while True:
        try:
            tx.send_nowait(b"x" * 24)
        except WouldBlock:
            break
        sent += 1
    done = anyio.Event()

    async def send_late() -> None:
        await tx.send(b"late")
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(send_late)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        batch = await rx.receive_batch()  # frees the whole ring at once
        assert len(batch) == sent
    assert await rx.receive() == b"late"


async def test_receive_batch_respects_max_messages(ring: ShmRing) -> None:
    tx, rx = ring.async_sender(), ring.async_receiver()
    for i in range(5):
        await tx.send(bytes([i]))
    assert await rx.receive_batch(2) == [b"\0", b"\1"]
    assert rx.receive_all_nowait() == [b"\2", b"\3", b"\4"]


async def test_iteration_ends_when_the_sender_closes(ring: ShmRing) -> None:
    async with ring.async_sender() as tx:
        await tx.send(b"last")
    assert [m async for m in ring.async_receiver()] == [b"last"]
    with pytest.raises(RingClosedError):
        await ring.async_receiver().receive()


async def test_cancelled_receives_lose_and_duplicate_nothing(ring: ShmRing) -> None:
    """A producer thread streams numbered messages while receives are cancelled at random."""
    count = 3000
    rx: AsyncRingReceiver = ring.async_receiver()
    tx = ring.sender()

    def produce() -> None:
        for i in range(count):
            tx.send(i.to_bytes(4, "little"), timeout=10)
        tx.close()

    rng = random.Random(7)
    received: list[int] = []
    cancelled = 0
    thread = threading.Thread(target=produce)
    thread.start()
    try:
        while True:
            with anyio.move_on_after(rng.choice((0, 0, 1e-5, 1e-4, 1e-3))) as scope:
                try:
                    received.append(int.from_bytes(await rx.receive(), "little"))
                except RingClosedError:
                    break
            cancelled += scope.cancelled_caught
    finally:
        thread.join(10)
    assert received == list(range(count))
    assert cancelled > 100  # the test did cancel receives, many of them


async def test_cancelled_sends_are_all_or_nothing(ring: ShmRing) -> None:
    """Sends into a full ring, cancelled at random: exactly the completed ones arrive."""
    tx = ring.async_sender()
    rx = ring.receiver()
    received: list[int] = []

    def consume() -> None:
        try:
            while True:
                received.append(int.from_bytes(rx.receive(timeout=10)[:4], "little"))
        except RingClosedError:
            pass

    rng = random.Random(11)
    completed: list[int] = []
    thread = threading.Thread(target=consume)
    thread.start()
    try:
        for i in range(3000):
            with anyio.move_on_after(rng.choice((0, 1e-5, 1e-4, 1e-3))):
                await tx.send(i.to_bytes(4, "little") + b"." * rng.randrange(100))
                completed.append(i)
    finally:
        tx.close()
        thread.join(10)
    assert received == completed
    assert 0 < len(completed) < 3000


async def test_cancelling_a_waiting_receive_leaves_the_ring_usable(ring: ShmRing) -> None:
    tx, rx = ring.async_sender(), ring.async_receiver()
    with anyio.move_on_after(0.01):
        await rx.receive()
    await tx.send(b"next")
    assert await rx.receive() == b"next"


async def test_many_tasks_share_a_full_ring(ring: ShmRing) -> None:
    """Senders queue for room in turn (Trio allows one waiter per fd, asyncio drops extras)."""
    tx, rx = ring.async_sender(), ring.async_receiver()
    received: list[bytes] = []

    async def send_all(task: int) -> None:
        for i in range(50):
            await tx.send(f"{task}:{i}".encode() * 4)

    async def receive_all() -> None:
        while len(received) < 10 * 50:
            received.extend(await rx.receive_batch())

    async with anyio.create_task_group() as tg:
        for task in range(10):
            tg.start_soon(send_all, task)
        await anyio.wait_all_tasks_blocked()  # the ring is full and the senders queue
        assert tx._queue.waiting > 1
        tg.start_soon(receive_all)
    for task in range(10):  # all arrived, each sender's in its order
        mine = [m for m in received if m.startswith(f"{task}:".encode())]
        assert mine == [f"{task}:{i}".encode() * 4 for i in range(50)]


async def test_many_tasks_share_an_empty_ring(ring: ShmRing) -> None:
    tx, rx = ring.async_sender(), ring.async_receiver()
    got: list[bytes] = []

    async def receive_one() -> None:
        got.append(await rx.receive())

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(receive_one)
        await anyio.wait_all_tasks_blocked()
        for i in range(5):
            await tx.send(bytes([i]))
    assert sorted(got) == [bytes([i]) for i in range(5)]
