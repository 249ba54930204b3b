"""Helpers for the engine tests: an in-process EngineCore on the tiny model, and a loop that runs
requests to completion and collects what each one produced."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trio_llm.config import EngineArgs
from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreOutput, EngineCoreRequest, TokenLogprobs
from trio_llm.sampling_params import SamplingParams


@dataclass
class Finished:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None
    error_param: str | None = None
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    outputs: int = 0

    def take(self, out: EngineCoreOutput) -> None:
        assert self.finish_reason is None, "output after the finish"
        self.outputs += 1
        self.token_ids += out.new_token_ids
        self.logprobs += out.new_logprobs or []
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        if out.num_cached_tokens:
            self.num_cached_tokens = out.num_cached_tokens
        self.finish_reason = out.finish_reason
        self.stop_reason = out.stop_reason
        self.error = out.error
        self.error_param = out.error_param


def make_core(model_dir: Path, **kwargs: object) -> EngineCore:
    """An in-process engine, in float32 unless `dtype` says otherwise: these tests compare the
    engine's runs with each other and with Hugging Face in float32, which only float32 can
    match on every machine (`dtype="auto"` is bfloat16 on AVX512-BF16 and AMX CPUs)."""
    kwargs.setdefault("kv_cache_memory", "8MiB")
    kwargs.setdefault("dtype", "float32")
    return EngineCore(EngineArgs(model=str(model_dir), **kwargs))  # type: ignore[arg-type]


def request(
    request_id: str, prompt: list[int], priority: int = 0, **params: object
) -> EngineCoreRequest:
    params.setdefault("temperature", 0.0)
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(**params),  # type: ignore[arg-type]
        priority=priority,
    )


def run(
    core: EngineCore, requests: Iterable[EngineCoreRequest], max_steps: int = 10_000
) -> dict[str, Finished]:
    """Submit all requests at once and step until they have finished (or the engine has no
    work)."""
    results: dict[str, Finished] = {}
    for req in requests:
        results[req.request_id] = Finished()
        core.add_request(req)
    for _ in range(max_steps):
        if all(r.finish_reason is not None for r in results.values()):
            break
        if not core.has_work():
            wait = core.idle_timeout()  # a grammar compiling
            if wait is None:
                break
            time.sleep(wait)
            continue
        for out in core.step().outputs:
            results[out.request_id].take(out)
    else:
        raise AssertionError("the engine did not finish its requests")
    return results


def random_prompts(lengths: Iterable[int], seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Skip the low ids: the tokenizer's special tokens (EOS among them) live there.
    return [torch.randint(100, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy continuation of `prompt` (what the engine must reproduce)."""
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.config.eos_token_id,
        )
    return out[0, len(prompt) :].tolist()
