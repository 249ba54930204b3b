"""The KV-cache event publisher against a real ZeroMQ subscriber, as a KV-aware router
(vllm-router's kv_aware policy) reads it: multipart `[topic, seq, payload]`, seq a big-endian
counter, payload `[ts, events, rank]` with events as maps tagged by `type`."""

from __future__ import annotations

import socket

import msgspec
import zmq

from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.kv_events import KVEventPublisher
from trio_llm.engine.step.sequence import Sequence
from trio_llm.sampling_params import SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def receive(sub: zmq.Socket, count: int) -> list[tuple[bytes, int, list]]:  # type: ignore[type-arg]
    messages = []
    for _ in range(count):
        topic, seq, payload = sub.recv_multipart()
        messages.append(
            (topic, int.from_bytes(seq, "big", signed=True), msgspec.msgpack.decode(payload))
        )
    return messages


def test_a_steps_events_reach_a_subscriber_in_vllms_format() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = KVEventPublisher(endpoint, topic="kv", block_size=4, rank=1)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(endpoint)
    try:
        # A PUB socket drops what it sends before the subscription arrives: prime it.
        for _ in range(200):
            publisher.stored(1, None, (1, 2, 3, 4))
            publisher.flush()
            if sub.poll(20):
                break
        while sub.poll(50):
            sub.recv_multipart()
        bm = BlockManager(3, 4, enable_prefix_caching=True, events=publisher)
        s = Sequence("r", list(range(9)), SamplingParams(), max_tokens=4)
        bm.allocate(s, 9)
        s.num_computed_tokens = 9
        bm.cache_full_blocks(s)
        publisher.flush()
        bm.deallocate(s)
        other = Sequence("o", list(range(50, 59)), SamplingParams(), max_tokens=4)
        bm.allocate(other, 9)  # evicts both cached blocks
        publisher.flush()
        publisher.flush()  # nothing recorded: nothing sent
        (t1, seq1, stored), (t2, seq2, removed) = receive(sub, 2)
        assert t1 == t2 == b"kv" and seq2 == seq1 + 1
        ts, [event], rank = stored
        assert isinstance(ts, float) and rank == 1
        assert event["type"] == "BlockStored"
        assert event["token_ids"] == list(range(8)) and event["block_size"] == 4
        first, second = event["block_hashes"]
        assert event["parent_block_hash"] is None and 0 <= first < 2**64 and 0 <= second < 2**64
        _, [gone], _ = removed
        assert gone["type"] == "BlockRemoved" and sorted(gone["block_hashes"]) == sorted(
            [first, second]
        )
        assert not sub.poll(100)
    finally:
        sub.close(linger=0)
        context.term()
        publisher.close()


def test_the_first_message_of_an_engines_life_clears_what_a_predecessor_published() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = KVEventPublisher(endpoint, block_size=16)
    try:
        assert [type(e).__name__ for e in publisher._events] == ["AllBlocksCleared"]
    finally:
        publisher.close()
