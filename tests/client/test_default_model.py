"""Real text from the real default model (SmolLM2-135M-Instruct), through the whole client.

These check text, not concurrency, so they run on Trio only: every backend-dependent behaviour
is covered on both backends with the tiny model, and the real model costs seconds per start.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from engine_dtype import ENGINE_DTYPE
from trio_llm import (
    Constraint,
    EngineClient,
    RequestOutputKind,
    SamplingParams,
    SamplingParamsError,
    open_engine,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "trio"


@pytest.fixture(scope="module")
async def client(anyio_backend: str) -> AsyncIterator[EngineClient]:
    async with open_engine(num_threads=2, kv_cache_memory="64MiB", dtype=ENGINE_DTYPE) as c:
        yield c


async def chat(client: EngineClient, question: str, max_tokens: int) -> tuple[list[str], list[int]]:
    prompt = await client.apply_chat_template([{"role": "user", "content": question}])
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, output_kind=RequestOutputKind.DELTA
    )
    pieces, tokens = [], []
    async for out in client.generate(prompt, params):
        pieces.append(out.outputs[0].text)
        tokens += out.outputs[0].token_ids
    return pieces, tokens


CAPITAL_QUESTION = "What is the capital of France? Answer in one sentence."
"""Asked bare, the question's first token is a near tie: float32 on the file's weights puts
"The" 0.08 nats above "L" (of "L'Étoile..."), less than a bf16 logit's step, so which wins
depends on the kernel that took the prefill (int4 or the dense copy), not on the engine being
right. With "in one sentence" every greedy token up to "Paris" leads by at least 0.86 nats."""


async def test_capital_of_france(client: EngineClient) -> None:
    assert client.model_config.model == "SmolLM2-135M-Instruct"
    pieces, _ = await chat(client, CAPITAL_QUESTION, 12)
    assert "Paris" in "".join(pieces)


async def test_multibyte_text_streams_without_replacement_characters(client: EngineClient) -> None:
    pieces, tokens = await chat(client, "Translate 'good morning' into Japanese.", 24)
    tokenizer = client.tokenizer
    # Meaningful only if characters really were split across tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokens)
    streamed = "".join(pieces)
    assert not any("\ufffd" in piece for piece in pieces)
    assert any(ord(c) > 0x3000 for c in streamed)  # kana or kanji
    # All of the text, except a last character that max_tokens cut in half.
    whole = tokenizer.decode(tokens, skip_special_tokens=True)
    assert whole.startswith(streamed) and set(whole[len(streamed) :]) <= {"\ufffd"}


async def test_a_constraint_through_the_library(client: EngineClient) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    prompt = await client.apply_chat_template([{"role": "user", "content": "Weather in Rome?"}])
    params = SamplingParams(
        max_tokens=64,
        temperature=0.0,
        n=2,
        constraint=Constraint.json_schema(schema),
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    [out] = [o async for o in client.generate(prompt, params)]
    for choice in out.outputs:
        assert choice.finish_reason == "stop"
        assert set(json.loads(choice.text)) == {"city", "sunny"}


async def test_a_constraint_the_engine_cannot_enforce_raises_before_sending(
    client: EngineClient,
) -> None:
    params = SamplingParams(constraint=Constraint.regex("a(b"))
    with pytest.raises(SamplingParamsError) as info:
        async for _ in client.generate([1, 2, 3], params):
            pass
    assert info.value.param == "constraint" and "unclosed group" in str(info.value)
    assert client.stats().num_requests_in_flight == 0


async def test_the_default_model_answers_alike_alone_and_batched() -> None:
    """The real default model (its Q4_1 file) with batch invariance on, through the whole
    client: 8 greedy and 8 seeded sampled requests give the same tokens alone and all 16
    together. `on` here holds on every CPU class; `auto` turns it on by itself where it costs
    a decode step nothing (tests/engine/test_batch_invariance.py fakes the classes)."""
    import trio

    questions = [CAPITAL_QUESTION, "Name three colours.", "Write a haiku about rain.", "12 x 7?"]
    async with open_engine(
        num_threads=2, kv_cache_memory="64MiB", dtype=ENGINE_DTYPE, batch_invariant="on"
    ) as engine:
        prompts = [
            await engine.apply_chat_template([{"role": "user", "content": q}]) for q in questions
        ]
        kinds = [SamplingParams(max_tokens=24, temperature=0.0)] * 8
        kinds += [SamplingParams(max_tokens=24, temperature=1.0, seed=100 + i) for i in range(8)]
        requests = [(prompts[i % 4], params) for i, params in enumerate(kinds)]

        async def tokens(prompt: str, params: SamplingParams) -> list[int]:
            out: list[int] = []
            async for piece in engine.generate(prompt, params):
                out = list(piece.outputs[0].token_ids)
            return out

        alone = [await tokens(*r) for r in requests]
        together: list[list[int]] = [[] for _ in requests]

        async def one(i: int) -> None:
            together[i] = await tokens(*requests[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(requests)):
                nursery.start_soon(one, i)
    assert all(alone) and together == alone
