"""The synchronous LLM: a Trio loop in a thread, one engine for the object's lifetime."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trio_llm import LLM, SamplingParams


def test_batch_generation_in_order_then_close(tiny_model_dir: Path) -> None:
    with LLM(str(tiny_model_dir), num_threads=1, kv_cache_memory="16MiB") as llm:
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        outputs = llm.generate(["First prompt", "Second, longer prompt here"], params)
        assert [o.prompt for o in outputs] == ["First prompt", "Second, longer prompt here"]
        assert all(o.finished and len(o.outputs[0].token_ids) == 6 for o in outputs)
        (single,) = llm.generate(llm.tokenizer.encode("First prompt"), params)
        assert single.outputs[0].token_ids == outputs[0].outputs[0].token_ids  # greedy
        per_prompt = llm.generate(
            ["a", "b"], [params, SamplingParams(max_tokens=2, ignore_eos=True)]
        )
        assert [len(o.outputs[0].token_ids) for o in per_prompt] == [6, 2]
        pid = llm._loop.client.pid  # type: ignore[union-attr]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the engine is gone (and reaped)
    llm.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate("again", params)
