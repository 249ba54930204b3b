"""The KV-cache event publisher against a real ZeroMQ subscriber, as a KV-aware router
(vllm-router's kv_aware policy) reads it: multipart `[topic, seq, payload]`, seq a big-endian
counter, payload `[ts, events, rank]` with events as maps tagged by `type`."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np
import torch
import zmq

from trio_llm.engine.lora import adapter_root
from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.images import ImageSlot
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


@contextmanager
def subscribed(**publisher_args: Any) -> Iterator[tuple[KVEventPublisher, zmq.Socket]]:  # type: ignore[type-arg]
    """A publisher on a free loopback port and a SUB socket that already receives from it: a
    PUB socket drops what it sends before the subscription arrives, so it is primed with
    throwaway events until one gets through, and those are drained."""
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", **publisher_args)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(publisher.endpoint)
    try:
        for _ in range(200):
            publisher.stored(1, None, (1, 2, 3, 4))
            publisher.flush()
            if sub.poll(20):
                break
        while sub.poll(50):
            sub.recv_multipart()
        yield publisher, sub
    finally:
        sub.close(linger=0)
        context.term()
        publisher.close()


def test_a_steps_events_reach_a_subscriber_in_vllms_format() -> None:
    with subscribed(topic="kv", block_size=4, rank=1) as (publisher, sub):
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


def test_the_first_message_of_an_engines_life_clears_what_a_predecessor_published() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = KVEventPublisher(endpoint, block_size=16)
    try:
        assert [type(e).__name__ for e in publisher._events] == ["AllBlocksCleared"]
    finally:
        publisher.close()


def test_blocks_of_a_lora_adapter_carry_its_id_and_name_as_vllms_do() -> None:
    """A sequence on an adapter hashes its blocks from the adapter's root; its BlockStored
    says which adapter (vLLM's `lora_id`, `lora_name`), the base model's says none."""
    with subscribed(block_size=4) as (publisher, sub):
        bm = BlockManager(6, 4, enable_prefix_caching=True, events=publisher)
        base = Sequence("base", list(range(8)), SamplingParams(), max_tokens=4)
        tuned = Sequence("tuned", list(range(8)), SamplingParams(), max_tokens=4)
        tuned.adapter, tuned.cache_root = (3, "sql"), adapter_root(3)
        for s in (base, tuned):
            bm.allocate(s, 8)
            s.num_computed_tokens = 8
            bm.cache_full_blocks(s)
        publisher.flush()
        [(_, _, (_, [plain, adapted], _))] = receive(sub, 1)
        assert (plain["lora_id"], plain["lora_name"]) == (None, None)
        assert (adapted["lora_id"], adapted["lora_name"]) == (3, "sql")
        assert adapted["token_ids"] == plain["token_ids"] == list(range(8))
        assert not set(adapted["block_hashes"]) & set(plain["block_hashes"])


def test_blocks_holding_an_image_carry_its_digest_as_vllms_extra_keys() -> None:
    """Two prompts with the same tokens and different pictures behind the placeholders: their
    blocks hash apart, and a router learns why from `extra_keys` (one entry a block: the
    digests of the images it holds, none for a block of text alone); text-only events do not
    carry the field at all."""
    with subscribed(block_size=4) as (publisher, sub):
        bm = BlockManager(12, 4, enable_prefix_caching=True, events=publisher)
        digests = [hashlib.sha256(name).digest() for name in (b"cat", b"dog")]
        text = Sequence("text", list(range(100, 112)), SamplingParams(), max_tokens=4)
        pictured = []
        for i, digest in enumerate(digests):
            s = Sequence(f"p{i}", list(range(12)), SamplingParams(), max_tokens=4)
            # Placeholders at positions 2-6: blocks 0 and 1 hold some, block 2 none.
            s.images = [ImageSlot(2, 5, np.arange(5), torch.zeros(3, 2, 2), digest)]
            pictured.append(s)
        for s in (text, *pictured):
            bm.allocate(s, 12)
            s.num_computed_tokens = 12
            bm.cache_full_blocks(s)
        publisher.flush()
        [(_, _, (_, [plain, cat, dog], _))] = receive(sub, 1)
        assert "extra_keys" not in plain
        for event, digest in ((cat, digests[0]), (dog, digests[1])):
            assert event["token_ids"] == list(range(12))
            assert event["extra_keys"] == [[digest.hex()], [digest.hex()], None]
        assert not set(cat["block_hashes"]) & set(dog["block_hashes"])
