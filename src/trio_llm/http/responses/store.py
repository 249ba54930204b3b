"""Stored responses: what GET /v1/responses/{id} returns and what previous_response_id
continues, kept in memory and bounded.

A stored response keeps its response object and its conversation: the history it continued
(its own previous response's conversation and output) and its input items, the instructions
left out (OpenAI does not carry them over). The items are immutable and shared, so a chain of
N responses holds N tuples of references, not N copies of the text.

Invariants: at most `capacity` responses are kept; storing one more evicts the least recently
used (stored, retrieved or continued); capacity 0 keeps nothing; with a `ttl`, a response not
used for that long is gone. Nothing is stored for a request with `store: false`, nor for one
that failed. A response is stored before its last byte goes out, so a client (or a router)
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
    conversation: tuple[InputItem, ...]
    """The history and the input items of the request that made `response`."""

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

    async def delete(self, response_id: str) -> None:
        await trio.lowlevel.checkpoint()
        if self._responses.pop(response_id, None) is None:
            raise not_found(response_id)


class RedisResponseStore:
    """The stored responses in a Redis server, shared by every frontend that names it.

    Each response is one key (msgpack, expiring `ttl` seconds after its last use when `ttl`
    is set), and a sorted set orders them by last use, so the least recently used beyond
    `capacity` are evicted whichever server stored them. redis-py's client is synchronous:
    each call runs in a worker thread (bounded by `limiter`), never on the event loop."""

    def __init__(
        self, url: str, capacity: int, ttl: float = 0.0, *, prefix: str = "trio-llm"
    ) -> None:
        import redis

        self.capacity = capacity
        self.ttl = ttl
        self._redis = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
        self._key = f"{prefix}:response:"
        self._order = f"{prefix}:responses"
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(StoredResponse)
        self._limiter = trio.CapacityLimiter(16)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _expiry(self) -> int | None:
        return max(1, round(self.ttl)) if self.ttl else None

    def _put(self, response_id: str, data: bytes) -> None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key + response_id, data, ex=self._expiry())
            pipe.zadd(self._order, {response_id: time.time()})
            pipe.zcard(self._order)
            *_, count = pipe.execute()
        excess = int(count) - self.capacity
        if excess > 0:
            evicted = [m.decode() for m, _ in self._redis.zpopmin(self._order, excess)]
            if evicted:
                self._redis.delete(*(self._key + e for e in evicted))

    def _get(self, response_id: str) -> bytes | None:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._key + response_id)
            if self.ttl:
                pipe.expire(self._key + response_id, self._expiry(), xx=True)
            data = pipe.execute()[0]
        if data is None:
            self._redis.zrem(self._order, response_id)
            return None
        self._redis.zadd(self._order, {response_id: time.time()}, xx=True)
        return data

    def _delete(self, response_id: str) -> int:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key + response_id)
            pipe.zrem(self._order, response_id)
            deleted, _ = pipe.execute()
        return int(deleted)

    async def put(self, stored: StoredResponse) -> None:
        if self.capacity == 0:
            await trio.lowlevel.checkpoint()
            return
        await self._run(self._put, stored.response.id, self._encoder.encode(stored))

    async def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        data = await self._run(self._get, response_id)
        if data is None:
            raise not_found(response_id, param)
        return self._decoder.decode(data)

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
