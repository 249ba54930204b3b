"""Starting and losing the engine process: start-up failures, a killed engine, shutdown."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import anyio
import pytest

from engine_dtype import ENGINE_DTYPE
from trio_llm import (
    EngineDeadError,
    EngineStartError,
    RequestOutputKind,
    SamplingParams,
    open_engine,
)

pytestmark = pytest.mark.anyio

SMALL = {"num_threads": 1, "kv_cache_memory": "16MiB", "dtype": ENGINE_DTYPE}


async def test_killed_engine_fails_requests_in_flight_and_new_ones(tiny_model_dir: Path) -> None:
    params = SamplingParams(max_tokens=1500, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    raised_at: list[float] = []
    errors: list[EngineDeadError] = []
    streaming: list[int] = []
    all_streaming = anyio.Event()

    async def in_flight(index: int) -> None:
        try:
            async for _ in client.generate("Keep going", params):
                if index not in streaming:
                    streaming.append(index)
                    if len(streaming) == 3:
                        all_streaming.set()
        except EngineDeadError as exc:
            raised_at.append(anyio.current_time())
            errors.append(exc)

    async with open_engine(str(tiny_model_dir), **SMALL) as client:
        async with anyio.create_task_group() as tg:
            for index in range(3):
                tg.start_soon(in_flight, index)
            with anyio.fail_after(30):
                await all_streaming.wait()
            os.kill(client.pid, signal.SIGKILL)
            killed_at = anyio.current_time()
        assert len(errors) == 3
        assert max(raised_at) - killed_at < 1.0
        assert "SIGKILL" in str(errors[0])
        with anyio.fail_after(1):
            await client.wait_dead()
        assert not client.is_alive
        with pytest.raises(EngineDeadError):
            client.generate("too late", params)
        leaving = anyio.current_time()
    assert anyio.current_time() - leaving < 1.0  # nothing left to stop: no hang, no timeout


async def test_a_model_that_fails_to_load_raises_the_engines_message(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"this is not a safetensors file")
    with anyio.fail_after(60), pytest.raises(EngineStartError) as info:
        async with open_engine(str(broken), **SMALL):
            pytest.fail("the engine must not become ready")
    # The loader's own words, carried from the engine process.
    assert "error while deserializing header" in str(info.value).lower()
    assert "Traceback" in info.value.engine_traceback


async def test_startup_timeout(tiny_model_dir: Path) -> None:
    with anyio.fail_after(30), pytest.raises(EngineStartError, match="startup_timeout"):
        async with open_engine(str(tiny_model_dir), startup_timeout=0.2, **SMALL):
            pytest.fail("the engine must not become ready in 0.2 s")
