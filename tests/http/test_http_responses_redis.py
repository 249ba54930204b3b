"""The Responses store in a real `redis-server`: each turn stored once and linked by
`previous_response_id`, so a conversation of N turns takes O(N) bytes (the earlier format, every
turn carrying the whole conversation, took O(N^2)); the chain read back whole, its TTLs
refreshed as it is used, and continued through the HTTP endpoint like the memory store."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import msgspec
import pytest
import redis
import trio
from http_fake_engine import FakeEngine

from trio_llm.http import ServerConfig, build_app
from trio_llm.http.responses.protocol import (
    InputItem,
    MessageItem,
    OutputMessage,
    OutputTextPart,
    ResponseObject,
)
from trio_llm.http.responses.store import RedisResponseStore, StoredResponse

REDIS = shutil.which("redis-server")
# About a paragraph each way: a turn's size is its text, as in a real conversation.
QUESTION = "Tell me more about the thing you said, in detail please. " * 4
ANSWER = "Here is a longer answer that goes on about the thing at some length. " * 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if REDIS is None:
        pytest.skip("redis-server is not installed (scripts/bootstrap.sh installs it as root)")
    port = free_port()
    process = subprocess.Popen(
        [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisResponseStore]:
    redis.Redis.from_url(redis_url).flushdb()
    yield RedisResponseStore(redis_url, capacity=10_000, ttl=3600)


def turn(i: int, previous: StoredResponse | None) -> StoredResponse:
    """The i-th turn of a conversation, as the endpoint stores it."""
    response = ResponseObject(
        id=f"resp_{i:04d}",
        created_at=0,
        status="completed",
        model="m",
        previous_response_id=previous.response.id if previous else None,
        output=[
            OutputMessage(
                id=f"msg_{i:04d}", status="completed", content=[OutputTextPart(text=ANSWER)]
            )
        ],
    )
    items: tuple[InputItem, ...] = (MessageItem(role="user", content=f"{i}: {QUESTION}"),)
    return StoredResponse(response, previous.continued() if previous else (), items)


async def test_a_chain_is_read_back_whole(store: RedisResponseStore) -> None:
    previous = None
    chain = []
    for i in range(5):
        previous = turn(i, previous)
        chain.append(previous)
        await store.put(previous)
    got = await store.get(chain[-1].response.id)
    assert got.response == chain[-1].response
    assert got.conversation == chain[-1].conversation
    assert len(got.continued()) == 10  # five questions, five answers
    assert (await store.get(chain[2].response.id)).conversation == chain[2].conversation
    assert await store.retrieve(chain[1].response.id) == chain[1].response


async def test_stored_bytes_grow_linearly_with_the_turns(store: RedisResponseStore) -> None:
    """200 turns take about twice the bytes of 100 (the whole conversation under every turn's
    key would take about four times: its sizes are summed here for comparison)."""
    previous = None
    whole_conversations = 0
    sizes = {}
    for i in range(200):
        previous = turn(i, previous)
        await store.put(previous)
        whole_conversations += len(msgspec.msgpack.encode((previous.response, previous.history)))
        if i + 1 in (100, 200):
            sizes[i + 1] = (await trio.to_thread.run_sync(store.stored_bytes), whole_conversations)
    (bytes_100, quadratic_100), (bytes_200, quadratic_200) = sizes[100], sizes[200]
    print(f"redis bytes: 100 turns {bytes_100}, 200 turns {bytes_200}")
    print(f"whole conversation per turn: 100 turns {quadratic_100}, 200 turns {quadratic_200}")
    # Linear: twice the turns, twice the bytes (plus the sorted set's own slack); quadratic
    # would be about four times.
    assert bytes_200 < 2.3 * bytes_100
    assert quadratic_200 > 3.5 * quadratic_100
    assert bytes_200 < quadratic_200 / 20
    # And the 200th turn still has all its history.
    got = await store.get(previous.response.id)
    assert len(got.continued()) == 400


async def test_using_a_turn_refreshes_the_ttl_of_its_whole_chain(
    store: RedisResponseStore, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    first = turn(0, None)
    second = turn(1, first)
    await store.put(first)
    await store.put(second)
    first_key = "trio-llm:turn:" + first.response.id
    client.expire(first_key, 5)
    await store.get(second.response.id)  # read: the chain is used
    assert client.ttl(first_key) > 3000
    client.expire(first_key, 5)
    third = turn(2, second)
    await store.put(third)  # extended: the chain is used again
    assert client.ttl(first_key) > 3000


async def test_a_chain_with_a_turn_gone_ends_there(store: RedisResponseStore) -> None:
    first = turn(0, None)
    second = turn(1, first)
    third = turn(2, second)
    for stored in (first, second, third):
        await store.put(stored)
    await store.delete(second.response.id)
    with pytest.raises(Exception, match="not found"):
        await store.get(third.response.id, "previous_response_id")
    assert await store.retrieve(third.response.id) == third.response  # alone, it is still there
    assert (await store.get(first.response.id)).conversation == first.conversation


async def test_the_endpoint_continues_a_conversation_from_redis(redis_url: str, serve_app) -> None:  # type: ignore[no-untyped-def]
    redis.Redis.from_url(redis_url).flushdb()
    engine = FakeEngine(finish_reason="stop", max_model_len=4096)
    url = await serve_app(build_app(engine, config=ServerConfig(responses_store=redis_url)))
    async with httpx.AsyncClient(base_url=url) as client:
        previous = None
        for text in ("one", "two", "three"):
            body = {"input": text, "max_output_tokens": 2, "previous_response_id": previous}
            response = await client.post("/v1/responses", json=body)
            assert response.status_code == 200, response.text
            previous = response.json()["id"]
        assert (await client.get(f"/v1/responses/{previous}")).json()["id"] == previous
    prompts = ["".join(map(chr, ids)) for ids in engine.prompts.values()]
    assert prompts[-1] == "<user>one<assistant>ab<user>two<assistant>ab<user>three<assistant>"
