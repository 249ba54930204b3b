"""Stored responses: what GET /v1/responses/{id} returns and what previous_response_id
continues, kept in memory and bounded.

A stored response keeps its response object and its conversation: the history it continued
(its own previous response's conversation and output) and its input items, the instructions
left out (OpenAI does not carry them over). In memory the items are immutable and shared, so a
chain of N responses holds N tuples of references, not N copies of the text. In Redis each
response is stored once, as its own input items and its response (whose
`previous_response_id` links it to the turn it continued), and a conversation is read back by
walking those links: a chain of N turns takes O(N) bytes there, not the O(N^2) of every turn
carrying the whole conversation.

Invariants: at most `capacity` responses are kept; storing one more evicts the least recently
used (stored, retrieved or continued); capacity 0 keeps nothing; with a `ttl`, a response not
used for that long is gone. In Redis, using a response (storing one that continues it,
continuing it, retrieving it) uses every turn of its chain: their TTLs and their places in the
eviction order are refreshed with it, so a conversation in use is not cut from under it; a
conversation with a turn gone (evicted, expired, deleted) can no longer be continued past it
(retrieving a later turn still works). Nothing is stored for a request with `store: false`, nor
for one that failed. A response is stored before its last byte goes out, so a client (or a router)
that continues it at once, on any frontend sharing the store, finds it. In memory, everything
is lost when the server stops: it is a cache of conversations, not a database; in Redis it
lasts as long as Redis keeps it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
import trio

from trio_llm.http.errors import ProtocolError
from trio_llm.http.responses.protocol import (
    FunctionCall,
    FunctionCallItem,
    InputItem,
    MessageItem,
    OutputItem,
    OutputMessage,
    ResponseObject,
)


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: ResponseObject
    history: tuple[InputItem, ...]
    """What the request that made `response` continued: its previous response's conversation
    and output (empty without `previous_response_id`)."""
    items: tuple[InputItem, ...]
    """That request's own input items."""

    @property
    def conversation(self) -> tuple[InputItem, ...]:
        """The history and the input items of the request that made `response`."""
        return (*self.history, *self.items)

    def continued(self) -> tuple[InputItem, ...]:
        """What a request continuing this response starts from: its conversation and its
        output, as input items."""
        return (*self.conversation, *as_input_items(self.response.output))


def as_input_items(output: Iterable[OutputItem]) -> list[InputItem]:
    """Output items as the input items a next request would send back."""
    items: list[InputItem] = []
    for item in output:
        if isinstance(item, OutputMessage):
            items.append(MessageItem(role="assistant", content=list(item.content), id=item.id))
        elif isinstance(item, FunctionCall):
            items.append(
                FunctionCallItem(
                    call_id=item.call_id, name=item.name, arguments=item.arguments, id=item.id
                )
            )
    return items


T = TypeVar("T")


def not_found(response_id: str, param: str | None = None) -> ProtocolError:
    """OpenAI's 404 for an id it has no response for."""
    which = "Previous response" if param == "previous_response_id" else "Response"
    code = "previous_response_not_found" if param == "previous_response_id" else None
    return ProtocolError(404, f"{which} with id '{response_id}' not found.", param=param, code=code)


class ResponseStore(Protocol):
    """Where stored responses live: this process's memory (the default) or a Redis server
    that several frontends share (`--responses-store redis://...`), behind a router that may
    send a `previous_response_id` to another server than the one that stored it. Both keep
    at most `capacity` responses (least recently used evicted) for at most `ttl` seconds."""

    capacity: int

    async def put(self, stored: StoredResponse) -> None: ...

    async def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response, now the most recently used, or the 404 naming `param`."""
        ...

    async def retrieve(self, response_id: str) -> ResponseObject:
        """The response alone (GET /v1/responses/{id}), now the most recently used, or the
        404; it needs no earlier turn of its conversation."""
        ...

    async def delete(self, response_id: str) -> None:
        """Forget the response, or the 404."""
        ...


class MemoryResponseStore:
    """The stored responses in this process, least recently used first."""

    def __init__(self, capacity: int, ttl: float = 0.0) -> None:
        self.capacity = capacity
        self.ttl = ttl
        """Seconds a response is kept after it was last used; 0: until evicted."""
        self._responses: OrderedDict[str, tuple[StoredResponse, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    async def put(self, stored: StoredResponse) -> None:
        await trio.lowlevel.checkpoint()
        if self.capacity == 0:
            return
        self._responses[stored.response.id] = (stored, time.monotonic())
        self._responses.move_to_end(stored.response.id)
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)

    async def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        await trio.lowlevel.checkpoint()
        entry = self._responses.get(response_id)
        now = time.monotonic()
        if entry is None or (self.ttl and now - entry[1] > self.ttl):
            self._responses.pop(response_id, None)
            raise not_found(response_id, param)
        self._responses[response_id] = (entry[0], now)
        self._responses.move_to_end(response_id)
        return entry[0]

    async def retrieve(self, response_id: str) -> ResponseObject:
        return (await self.get(response_id)).response

    async def delete(self, response_id: str) -> None:
        await trio.lowlevel.checkpoint()
        if self._responses.pop(response_id, None) is None:
            raise not_found(response_id)


class StoredTurn(msgspec.Struct, array_like=True):
    """One response as Redis keeps it: its own input items, not the history, which its
    `previous_response_id` links to."""

    response: ResponseObject
    items: tuple[InputItem, ...]


_WALK = """
-- Walk a chain of turns from ARGV[2] back to its first, refreshing each one's TTL (ARGV[3]
-- seconds, 0: none) and its place in the eviction order (KEYS[1], to score ARGV[4]); return
-- 1 or 0 (whether the chain is whole) followed, with ARGV[5] = '1', by each turn's data,
-- newest first. One round trip, however long the chain.
local prefix, id, ttl, now, collect = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local out = {1}
local limit = tonumber(ARGV[6])
while id and id ~= '' do
  local key = prefix .. id
  local turn = redis.call('HMGET', key, 'd', 'p')
  if not turn[1] or limit <= 0 then
    out[1] = 0
    return out
  end
  limit = limit - 1
  if ttl > 0 then redis.call('EXPIRE', key, ttl) end
  redis.call('ZADD', KEYS[1], 'XX', now, id)
  if collect == '1' then out[#out + 1] = turn[1] end
  id = turn[2]
end
return out
"""


class RedisResponseStore:
    """The stored responses in a Redis server, shared by every frontend that names it.

    Each response is one hash (its `StoredTurn` as msgpack, and the id of the response it
    continued), expiring `ttl` seconds after its last use when `ttl` is set, and a sorted set
    orders them by last use, so the least recently used beyond `capacity` are evicted
    whichever server stored them. A conversation is read by a Lua script that walks the links
    in Redis (one round trip) and refreshes the chain as it goes; a standalone Redis (or
    Valkey) runs it, a cluster does not (the chain's keys are not declared). redis-py's client
    is synchronous: each call runs in a worker thread (bounded by `limiter`), never on the
    event loop."""

    def __init__(
        self, url: str, capacity: int, ttl: float = 0.0, *, prefix: str = "trio-llm"
    ) -> None:
        import redis

        self.capacity = capacity
        self.ttl = ttl
        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
        # Not the keys of the earlier format (one whole conversation per key): those expire
        # or stay, but are never misread.
        self._key = f"{prefix}:turn:"
        self._order = f"{prefix}:turns"
        self._walk = self._redis.register_script(_WALK)
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(StoredTurn)
        self._limiter = trio.CapacityLimiter(16)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _expiry(self) -> int | None:
        return max(1, round(self.ttl)) if self.ttl else None

    def _walk_chain(self, response_id: str, *, collect: bool) -> tuple[bool, list[bytes]]:
        """Whether the chain from `response_id` back is whole, and (with `collect`) each
        turn's data, newest first; every turn of it is used now."""
        whole, *data = self._walk(
            keys=[self._order],
            args=[
                self._key,
                response_id,
                self._expiry() or 0,
                time.time(),
                "1" if collect else "0",
                self.capacity + 1,  # no chain is longer than the store: a cycle's guard
            ],
        )
        return bool(whole), data

    def _put(self, response_id: str, previous: str | None, data: bytes) -> None:
        key = self._key + response_id
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"d": data, "p": previous or ""})
            if self.ttl:
                pipe.expire(key, self._expiry())
            pipe.zadd(self._order, {response_id: time.time()})
            pipe.zcard(self._order)
            *_, count = pipe.execute()
        if previous:  # the turns it continues are used again: not to expire before it
            self._walk_chain(previous, collect=False)
        excess = int(count) - self.capacity
        if excess > 0:
            evicted = [m.decode() for m, _ in self._redis.zpopmin(self._order, excess)]
            if evicted:
                self._redis.delete(*(self._key + e for e in evicted))

    def _get(self, response_id: str) -> list[bytes] | None:
        whole, data = self._walk_chain(response_id, collect=True)
        if not data:
            self._redis.zrem(self._order, response_id)
        return data if whole else None

    def _retrieve(self, response_id: str) -> bytes | None:
        self._walk_chain(response_id, collect=False)
        data: bytes | None = self._redis.hget(self._key + response_id, "d")
        if data is None:
            self._redis.zrem(self._order, response_id)
        return data

    def _delete(self, response_id: str) -> int:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key + response_id)
            pipe.zrem(self._order, response_id)
            deleted, _ = pipe.execute()
        return int(deleted)

    def stored_bytes(self) -> int:
        """What the stored turns take in Redis (`MEMORY USAGE` of each, the order's set
        included): the measure of how the store grows with a conversation."""
        keys = [self._key + m.decode() for m in self._redis.zrange(self._order, 0, -1)]
        return sum(self._redis.memory_usage(k, samples=0) or 0 for k in [*keys, self._order])

    async def put(self, stored: StoredResponse) -> None:
        if self.capacity == 0:
            await trio.lowlevel.checkpoint()
            return
        response = stored.response
        data = self._encoder.encode(StoredTurn(response, stored.items))
        await self._run(self._put, response.id, response.previous_response_id, data)

    async def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        data = await self._run(self._get, response_id)
        if data is None:
            raise not_found(response_id, param)
        return await trio.to_thread.run_sync(self._conversation, data, limiter=self._limiter)

    def _conversation(self, data: list[bytes]) -> StoredResponse:
        """The newest turn with its conversation, from the chain's turns, newest first."""
        *older, newest = (self._decoder.decode(d) for d in reversed(data))
        history: list[InputItem] = []
        for turn in older:
            history += turn.items
            history += as_input_items(turn.response.output)
        return StoredResponse(newest.response, tuple(history), newest.items)

    async def retrieve(self, response_id: str) -> ResponseObject:
        data = await self._run(self._retrieve, response_id)
        if data is None:
            raise not_found(response_id)
        return self._decoder.decode(data).response

    async def delete(self, response_id: str) -> None:
        if not await self._run(self._delete, response_id):
            raise not_found(response_id)


def open_response_store(url: str | None, capacity: int, ttl: float = 0.0) -> ResponseStore:
    """The store `--responses-store` names: None (or `memory`) for this process's memory,
    `redis://...` (or `rediss://`, `unix://`) for a shared Redis server."""
    if url is None or url == "memory":
        return MemoryResponseStore(capacity, ttl)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisResponseStore(url, capacity, ttl)
    raise ValueError(f"--responses-store {url!r}: give memory or a redis:// URL")
