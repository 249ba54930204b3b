"""Real text from the real default model (SmolLM2-135M-Instruct), through the whole client.

These check text, not concurrency, so they run on Trio only: every backend-dependent behaviour
is covered on both backends with the tiny model, and the real model costs seconds per start.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine_dtype import ENGINE_DTYPE
from trio_llm import EngineClient, RequestOutputKind, SamplingParams, open_engine

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


async def test_capital_of_france(client: EngineClient) -> None:
    assert client.model_config.model == "SmolLM2-135M-Instruct"
    pieces, _ = await chat(client, "What is the capital of France?", 12)
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
