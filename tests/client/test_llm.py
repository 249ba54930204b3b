"""The synchronous LLM: a Trio loop in a thread, one engine for the object's lifetime."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_dtype import ENGINE_DTYPE
from trio_llm import LLM, SamplingParams


def _interrupt_once_running(llm: LLM, count: int) -> None:
    """Send this process a real SIGINT once the engine runs `count` requests."""
    client = llm._loop.client
    assert client is not None
    deadline = time.monotonic() + 30
    while client.stats().num_running < count and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as it does in a terminal, however the suite was
    started: a background job of a non-interactive shell inherits SIGINT ignored, and Python
    then installs no handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_raises")
def test_batch_generation_in_order_interrupt_and_close(tiny_model_dir: Path) -> None:
    with LLM(
        str(tiny_model_dir), num_threads=1, kv_cache_memory="16MiB", dtype=ENGINE_DTYPE
    ) as llm:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        outputs = llm.generate(["First prompt", "Second, longer prompt here"], params)
        assert [o.prompt for o in outputs] == ["First prompt", "Second, longer prompt here"]
        assert all(o.finished and len(o.outputs[0].token_ids) == 6 for o in outputs)
        (single,) = llm.generate(llm.tokenizer.encode("First prompt"), params)
        assert single.outputs[0].token_ids == outputs[0].outputs[0].token_ids  # greedy
        two = SamplingParams(max_tokens=2, ignore_eos=True)
        per_prompt = llm.generate(["a", "b"], [params, two])
        assert [len(o.outputs[0].token_ids) for o in per_prompt] == [6, 2]

        # Ctrl-C while generate() blocks: it raises, and the engine drops the batch.
        long = SamplingParams(max_tokens=1500, ignore_eos=True)
        threading.Thread(target=_interrupt_once_running, args=(llm, 3)).start()
        with pytest.raises(KeyboardInterrupt):
            llm.generate(["one", "two", "three"], long)
        client = llm._loop.client
        assert client is not None
        deadline = time.monotonic() + 1.0
        while client.stats().num_running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.stats().num_running == 0
        assert client.stats().num_free_blocks == client.stats().num_total_blocks
        assert len(llm.generate("still usable", two)[0].outputs[0].token_ids) == 2
        pid = client.pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the engine is gone (and reaped)
    llm.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate("again", params)
