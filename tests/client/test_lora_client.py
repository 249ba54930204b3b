"""LoRA adapters through the library: `EngineClient.generate(..., lora=...)`, loads and unloads at
run time, `Router` by adapter name, and `LLM.generate(..., lora=...)`, against a real engine
process on the tiny model, checked against PEFT's merged model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from lora_adapters import ADAPTER_PROMPT as PROMPT
from lora_adapters import ADAPTER_TOKENS as TOKENS
from trio_llm import (
    LLM,
    EngineClient,
    LoraError,
    LoraNotFoundError,
    LoraRequest,
    RequestOutput,
    Router,
    SamplingParams,
    open_engine,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def client(
    tiny_model_dir: Path, tiny_adapters: dict[str, Path], anyio_backend: str
) -> AsyncIterator[EngineClient]:
    async with open_engine(
        str(tiny_model_dir),
        num_threads=1,
        kv_cache_memory="32MiB",
        dtype="float32",
        max_loras=2,
        max_lora_rank=8,
        lora_modules={"sql": str(tiny_adapters["sql"])},
    ) as c:
        yield c


def greedy(max_tokens: int = TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def tokens(
    client: EngineClient | Router, max_tokens: int = TOKENS, **kwargs: object
) -> list[int]:
    outputs: list[RequestOutput] = [
        out
        async for out in client.generate(PROMPT, greedy(max_tokens), **kwargs)  # type: ignore[arg-type]
    ]
    final = outputs[-1]
    assert final.finished
    return final.outputs[0].token_ids


async def test_generate_with_a_start_adapter_and_one_loaded_at_run_time(
    client: EngineClient,
    tiny_adapters: dict[str, Path],
    adapter_greedy: dict[str | None, list[int]],
) -> None:
    assert client.loras == {"sql": str(tiny_adapters["sql"])}
    assert await tokens(client, lora="sql") == adapter_greedy["sql"]
    assert await tokens(client) == adapter_greedy[None]
    await client.load_lora("chat", str(tiny_adapters["chat"]))
    assert set(client.loras) == {"sql", "chat"}
    async with anyio.create_task_group() as tasks:  # batched together
        results: dict[str | None, list[int]] = {}

        async def run(name: str | None) -> None:
            results[name] = await tokens(client, lora=name)

        for name in (None, "sql", "chat"):
            tasks.start_soon(run, name)
    assert results == {name: adapter_greedy[name] for name in (None, "sql", "chat")}
    await client.unload_lora("chat")
    assert set(client.loras) == {"sql"}
    with pytest.raises(LoraNotFoundError, match="'chat' is not loaded"):
        client.generate(PROMPT, greedy(), lora="chat")
    with pytest.raises(LoraNotFoundError):
        await client.unload_lora("chat")


async def test_loads_the_engine_refuses_say_why(
    client: EngineClient, tiny_adapters: dict[str, Path]
) -> None:
    with pytest.raises(LoraError, match="rank 16, over the engine's bound of 8"):
        await client.load_lora("wide", str(tiny_adapters["wide"]))
    with pytest.raises(LoraError, match="loaded already"):
        await client.load_lora("sql", str(tiny_adapters["chat"]))
    assert client.loras == {"sql": str(tiny_adapters["sql"])}


async def test_a_lora_request_is_loaded_on_first_use(
    client: EngineClient,
    tiny_adapters: dict[str, Path],
    adapter_greedy: dict[str | None, list[int]],
) -> None:
    request = LoraRequest("chat-auto", str(tiny_adapters["chat"]))
    async with anyio.create_task_group() as tasks:  # two first uses at once load it once
        for _ in range(2):
            tasks.start_soon(tokens, client)
            tasks.start_soon(lambda: tokens(client, lora=request))
    assert await tokens(client, lora=request) == adapter_greedy["chat"]
    assert "chat-auto" in client.loras
    await client.unload_lora("chat-auto")


async def test_a_request_in_flight_finishes_on_its_unloaded_adapter(
    client: EngineClient, tiny_adapters: dict[str, Path]
) -> None:
    await client.load_lora("long", str(tiny_adapters["chat"]))
    alone = await tokens(client, 200, lora="long")
    base = await tokens(client, 200)
    outputs = []
    async for out in client.generate(PROMPT, greedy(200), lora="long"):
        outputs.append(out)
        if len(outputs) == 2:
            await client.unload_lora("long")
            assert client.stats().num_running == 1  # it was still running then
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length"
    assert outputs[-1].outputs[0].token_ids == alone != base


async def test_a_router_sends_an_adapters_requests_to_its_base_model(
    client: EngineClient,
    tiny_adapters: dict[str, Path],
    adapter_greedy: dict[str | None, list[int]],
) -> None:
    router = Router.of(client)
    assert router.lora_for("sql") == "sql" and router.lora_for(client.model_config.model) is None
    assert await tokens(router, model="sql") == adapter_greedy["sql"]
    await router.load_lora("chat-r", str(tiny_adapters["chat"]))
    assert await tokens(router, model="chat-r") == adapter_greedy["chat"]
    await router.unload_lora("chat-r")
    assert "chat-r" not in client.loras


def test_llm_generates_with_one_adapter_per_prompt(
    tiny_model_dir: Path,
    tiny_adapters: dict[str, Path],
    adapter_greedy: dict[str | None, list[int]],
) -> None:
    with LLM(
        str(tiny_model_dir), num_threads=1, kv_cache_memory="16MiB", dtype="float32",
        enable_lora=True, max_lora_rank=8,
    ) as llm:  # fmt: skip
        sql = LoraRequest("sql", str(tiny_adapters["sql"]))
        outputs = llm.generate([PROMPT] * 3, greedy(), lora=[None, sql, sql])
        assert [o.outputs[0].token_ids for o in outputs] == [
            adapter_greedy[None],
            adapter_greedy["sql"],
            adapter_greedy["sql"],
        ]
        with pytest.raises(LoraNotFoundError):
            llm.generate(PROMPT, greedy(), lora="nope")
