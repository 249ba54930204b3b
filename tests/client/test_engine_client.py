"""The engine client against a real engine process running the tiny random-weight model.

One engine per backend for the whole module (starting one costs a few seconds). Every test
leaves the engine idle: no request running, every KV block free.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from engine_dtype import ENGINE_DTYPE
from trio_llm import (
    EngineClient,
    PromptTooLongError,
    RequestOutput,
    RequestOutputKind,
    SamplingParams,
    open_engine,
)
from trio_llm.sampling_params import SamplingParamsError

pytestmark = pytest.mark.anyio

DELTA, CUMULATIVE, FINAL = (
    RequestOutputKind.DELTA,
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.FINAL_ONLY,
)
LONG = 1500
"""max_tokens for a request that would run for seconds unless aborted."""


@pytest.fixture(scope="module")
async def client(tiny_model_dir: Path, anyio_backend: str) -> AsyncIterator[EngineClient]:
    async with open_engine(
        str(tiny_model_dir), num_threads=1, kv_cache_memory="32MiB", dtype=ENGINE_DTYPE
    ) as c:
        yield c


def greedy(max_tokens: int, kind: RequestOutputKind = DELTA, **kw: Any) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=kind, **kw
    )


async def wait_idle(client: EngineClient, within: float = 1.0) -> None:
    """The engine reports no running request and every KV block free, within `within` s."""
    with anyio.fail_after(within):
        while True:
            s = client.stats()
            if (
                s.num_running == 0
                and s.num_waiting == 0
                and s.num_free_blocks == s.num_total_blocks
            ):
                return
            await anyio.sleep(0.01)


async def collect(stream: Any) -> list[RequestOutput]:
    return [out async for out in stream]


async def test_model_config_and_tokenizer(client: EngineClient, tiny_model_dir: Path) -> None:
    config = client.model_config
    assert config.model == tiny_model_dir.name
    assert config.max_model_len == 2048
    assert config.vocab_size == len(client.tokenizer)
    assert (
        config.num_blocks > 0 and config.kv_capacity_tokens == config.num_blocks * config.block_size
    )
    ids = await client.encode("Hello world")
    assert await client.decode(ids) == "Hello world"
    chat = await client.apply_chat_template([{"role": "user", "content": "Hi"}])
    text = await client.decode(chat, skip_special_tokens=False)
    assert text.endswith("<|im_start|>assistant\n")
    assert client.is_alive
    # The model's generation_config.json as written (save_pretrained wrote token ids only).
    assert client.generation_config["eos_token_id"] == client.tokenizer.eos_token_id
    assert "temperature" not in client.generation_config


async def test_delta_stream(client: EngineClient) -> None:
    outs = await collect(client.generate("Once upon a time", greedy(12), request_id="delta-1"))
    assert all(o.request_id == "delta-1" for o in outs)
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    tokens = [t for o in outs for t in o.outputs[0].token_ids]
    assert len(tokens) == 12
    assert "".join(o.outputs[0].text for o in outs) == await client.decode(tokens)
    last = outs[-1]
    assert last.outputs[0].finish_reason == "length"
    assert last.prompt == "Once upon a time"
    assert last.prompt_token_ids == await client.encode("Once upon a time")
    m = last.metrics
    assert m.first_token_time is not None and m.finished_time is not None
    assert m.arrival_time <= m.first_token_time <= m.finished_time
    await wait_idle(client)


async def test_output_kinds_agree(client: EngineClient) -> None:
    prompt = await client.encode("The weather today")
    delta = await collect(client.generate(prompt, greedy(10, DELTA)))
    cumulative = await collect(client.generate(prompt, greedy(10, CUMULATIVE)))
    (final,) = await collect(client.generate(prompt, greedy(10, FINAL)))
    text = "".join(o.outputs[0].text for o in delta)
    assert cumulative[-1].outputs[0].text == final.outputs[0].text == text
    assert len(cumulative[-1].outputs[0].token_ids) == 10
    texts = [o.outputs[0].text for o in cumulative]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))


@pytest.mark.parametrize(
    "how", ["break", "aclose", "deadline", "keyboard_interrupt", "keyboard_interrupt_in_body"]
)
async def test_leaving_early_aborts_in_the_engine(client: EngineClient, how: str) -> None:
    params = greedy(LONG)
    if how == "break":
        async for _ in client.generate("Tell me a long story", params):
            break
    elif how == "aclose":
        stream = client.generate("Tell me a long story", params)
        await stream.__anext__()
        await stream.aclose()
    elif how == "deadline":
        with anyio.move_on_after(0.3) as scope:
            async for _ in client.generate("Tell me a long story", params):
                pass
        assert scope.cancelled_caught
    elif how == "keyboard_interrupt":
        stream = client.generate("Tell me a long story", params)
        await stream.__anext__()
        with pytest.raises(KeyboardInterrupt):
            await stream.athrow(KeyboardInterrupt())
    else:
        with pytest.raises(KeyboardInterrupt):
            async for _ in client.generate("Tell me a long story", params):
                raise KeyboardInterrupt
    await wait_idle(client)
    assert client.stats().num_requests_in_flight == 0


async def test_abort_by_request_id_ends_the_stream(client: EngineClient) -> None:
    outs: list[RequestOutput] = []
    streaming = anyio.Event()

    async def consume() -> None:
        async for out in client.generate("Count to a thousand", greedy(LONG), request_id="ab"):
            outs.append(out)
            streaming.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await streaming.wait()
        await client.abort("ab")
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    await wait_idle(client)


async def test_n_choices_come_as_one_stream_with_indexes(client: EngineClient) -> None:
    params = SamplingParams(n=3, seed=11, max_tokens=8, ignore_eos=True, output_kind=DELTA)
    outs = await collect(client.generate("Pick a word:", params))
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for out in outs:
        for choice in out.outputs:
            tokens[choice.index] += choice.token_ids
    assert all(len(t) == 8 for t in tokens.values())
    assert outs[-1].finished and sum(o.finished for o in outs) == 1
    assert len({tuple(t) for t in tokens.values()}) > 1  # seeds 11, 12, 13 differ
    final = msgspec.structs.replace(params, output_kind=FINAL)
    (again,) = await collect(client.generate("Pick a word:", final))
    assert {c.index: c.token_ids for c in again.outputs} == tokens  # the seeds reproduce
    await wait_idle(client)


async def test_stop_strings_cut_hold_back_and_abort(client: EngineClient) -> None:
    prompt = "A list of fruits:"
    (free,) = await collect(client.generate(prompt, greedy(40, FINAL)))
    text = free.outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop.strip()) >= 2, text  # a stop string made of real characters
    cut = text.index(stop)

    pieces = []
    async for out in client.generate(prompt, greedy(LONG, stop=[stop])):
        pieces.append(out.outputs[0].text)
    assert "".join(pieces) == text[:cut]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    await wait_idle(client)  # the frontend told the engine to stop

    (kept,) = await collect(
        client.generate(prompt, greedy(LONG, FINAL, stop=[stop], include_stop_str_in_output=True))
    )
    assert kept.outputs[0].text == text[: cut + len(stop)]
    await wait_idle(client)


async def test_a_slow_consumer_delays_nobody(client: EngineClient) -> None:
    slow_started, release = anyio.Event(), anyio.Event()
    slow_outputs: list[RequestOutput] = []

    async def slow() -> None:
        async for out in client.generate("Slow reader", greedy(60)):
            slow_outputs.append(out)
            slow_started.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(slow)
        await slow_started.wait()
        fast = await collect(client.generate("Fast reader", greedy(40)))
        assert fast[-1].finished
        assert sum(len(o.outputs[0].token_ids) for o in fast) == 40
        release.set()
    # The slow reader lost nothing: what piled up while it waited came merged, not queued.
    assert sum(len(o.outputs[0].token_ids) for o in slow_outputs) == 60
    assert len(slow_outputs) < 60
    await wait_idle(client)


async def test_logprobs(client: EngineClient) -> None:
    (out,) = await collect(client.generate("Hello", greedy(5, FINAL, logprobs=2)))
    choice = out.outputs[0]
    assert choice.logprobs is not None and len(choice.logprobs) == 5
    for position, token in zip(choice.logprobs, choice.token_ids):
        assert position.chosen.token_id == token and position.chosen.rank == 1  # greedy
        assert len(position.top) == 2
    assert choice.cumulative_logprob == pytest.approx(
        sum(p.chosen.logprob for p in choice.logprobs)
    )


async def test_invalid_requests_raise_before_anything_is_sent(client: EngineClient) -> None:
    with pytest.raises(PromptTooLongError) as info:
        client.generate([1] * 2000, SamplingParams(max_tokens=100))
    assert "2000" in str(info.value) and "100" in str(info.value)
    with pytest.raises(SamplingParamsError):
        client.generate("hi", SamplingParams(top_p=0))
    stream = client.generate("word " * 2100, SamplingParams(max_tokens=10))
    with pytest.raises(PromptTooLongError):
        await stream.__anext__()
    assert client.stats().num_requests_in_flight == 0
    first = client.generate("a", greedy(LONG), request_id="same")
    await first.__anext__()
    try:
        with pytest.raises(ValueError, match="already in flight"):
            client.generate("b", greedy(4), request_id="same")
    finally:
        await first.aclose()
    await wait_idle(client)
