"""KV-cache events: what the prefix cache gains and loses, published for an external router.

A router in front of several servers (vLLM's `vllm-router --policy kv_aware`, llm-d) routes a
prompt to the worker that already holds its prefix. It learns what each worker holds from the
worker's events, in vLLM's format and transport: a ZeroMQ PUB socket sending multipart messages
`[topic, seq, payload]`, `seq` an 8-byte big-endian counter (a gap or a restart from 0 tells the
subscriber it missed events), `payload` a msgpack array `[timestamp, events, data_parallel_rank]`
whose events are maps tagged by `type`: `BlockStored` (the chained block hashes of a run of
blocks, the hash of the block before the run, their token ids, the block size, and, for a
sequence on a LoRA adapter, whose hashes are the adapter's own, vLLM's `lora_id` (the adapter's
load id) and `lora_name`; for blocks that hold an image's placeholders, vLLM's `extra_keys`
(per block, the images' sha256 digests in hex); `medium` "GPU" on a CUDA engine, as vLLM's,
none on a CPU), `BlockRemoved` (hashes) and `AllBlocksCleared`. A router indexes the stored
blocks by their token ids (it learns each prompt's ids from the worker's render or `/tokenize`
routes) and chains them by the hashes.

Invariants:
- Events are sent in the order the block manager made them, once per engine step at most (a
  step's events in one message), and never block the engine: a router that falls behind loses
  messages (PUB drops them at its high-water mark) and sees the gap in `seq`.
- The first message of an engine's life is `AllBlocksCleared`: a restarted engine holds nothing,
  whatever its predecessor published.
- Hashes travel as unsigned 64-bit integers (Python's hash is signed; routers reject negatives).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    import zmq

log = logging.getLogger(__name__)

_U64 = (1 << 64) - 1


class _Event(msgspec.Struct, tag_field="type", tag=True):
    """vLLM's `KVCacheEvent`, as routers read it: a map whose `type` names the event
    (vllm-router 0.1.17 refuses the positional form: "KV event must be a tagged map")."""


class BlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[str, ...] | None] | msgspec.UnsetType = msgspec.UNSET
    """vLLM's: per block, what its hash holds beside the tokens (an image's content digest);
    sent only when some block of the event has any (routers that predate it never see it)."""


class BlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


class KVEventPublisher:
    """The block manager's event sink (`BlockEvents`) that publishes each step's events.

    `stored`/`removed` only record (the engine calls them inside a step); `flush` sends what
    the step recorded as one message. Consecutive stores of one chain merge into one
    `BlockStored`, consecutive removals into one `BlockRemoved`, as vLLM sends them."""

    def __init__(
        self,
        endpoint: str,
        *,
        topic: str = "",
        block_size: int,
        medium: str | None = None,
        rank: int | None = None,
        high_water_mark: int = 100_000,
    ) -> None:
        import zmq

        self._context = zmq.Context()
        self._socket: zmq.Socket[Any] = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.SNDHWM, high_water_mark)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.endpoint = endpoint
        self._topic = topic.encode()
        self._block_size = block_size
        self._medium = medium
        self._rank = rank
        self._seq = 0
        self._events: list[KVEvent] = [AllBlocksCleared()]
        self._encoder = msgspec.msgpack.Encoder()
        self._zmq = zmq

    # -- BlockEvents ---------------------------------------------------------------------

    def stored(
        self,
        block_hash: int,
        parent_hash: int | None,
        token_ids: tuple[int, ...],
        adapter: tuple[int, str] | None = None,
        extra_keys: tuple[str, ...] | None = None,
    ) -> None:
        """`adapter` (load id, name) sets vLLM's `lora_id` and `lora_name`: a router keys an
        adapter's blocks apart from the base model's, as their hashes are. `extra_keys`: the
        block's entry in vLLM's `extra_keys` (its images' digests)."""
        block_hash &= _U64
        parent = None if parent_hash is None else parent_hash & _U64
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockStored) and last.block_hashes[-1] == parent:
            last.block_hashes.append(block_hash)
            last.token_ids.extend(token_ids)
            if extra_keys is not None and last.extra_keys is msgspec.UNSET:
                last.extra_keys = [None] * (len(last.block_hashes) - 1)
            if last.extra_keys is not msgspec.UNSET:
                last.extra_keys.append(extra_keys)
            return
        self._events.append(
            BlockStored(
                block_hashes=[block_hash],
                parent_block_hash=parent,
                token_ids=list(token_ids),
                block_size=self._block_size,
                lora_id=None if adapter is None else adapter[0],
                medium=self._medium,
                lora_name=None if adapter is None else adapter[1],
                extra_keys=msgspec.UNSET if extra_keys is None else [extra_keys],
            )
        )

    def removed(self, block_hash: int) -> None:
        block_hash &= _U64
        last = self._events[-1] if self._events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(block_hash)
            return
        self._events.append(BlockRemoved(block_hashes=[block_hash], medium=self._medium))

    # -- sending -------------------------------------------------------------------------

    def flush(self) -> None:
        """Send the events recorded since the last flush, if any, without blocking."""
        if not self._events:
            return
        events, self._events = self._events, []
        payload = self._encoder.encode(KVEventBatch(time.time(), events, self._rank))
        frames = [self._topic, self._seq.to_bytes(8, "big", signed=True), payload]
        self._seq += 1
        try:
            self._socket.send_multipart(frames, flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            log.warning("KV events: a message was dropped (no subscriber keeps up)")

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()
