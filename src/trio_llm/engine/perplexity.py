"""Perplexity of a model on a text, through the engine: what keeps quantization honest.

The text is cut into windows of `window` tokens (non-overlapping, each scored from its second
token on, as a fresh context); every window is one request asking for its prompt tokens'
log-probabilities. bench/weights/quant_quality.py computes the same windows with llama.cpp (through
llama-cpp-python) on the same token ids, so the two numbers differ only by the engines.
"""

from __future__ import annotations

import math

from trio_llm.engine.step.core import EngineCore
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

WINDOW = 512


def windows(tokens: list[int], window: int = WINDOW) -> list[list[int]]:
    return [tokens[i : i + window] for i in range(0, len(tokens), window) if len(tokens) - i > 1]


def perplexity(core: EngineCore, tokens: list[int], window: int = WINDOW) -> float:
    """exp of the mean negative log-likelihood of every scored token."""
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    chunks = windows(tokens, window)
    for i, chunk in enumerate(chunks):
        core.add_request(EngineCoreRequest(f"ppl-{i}", chunk, params))
    scores: dict[str, list[float]] = {}
    while core.has_work():
        for out in core.step().outputs:
            if out.prompt_logprobs is not None:
                scores[out.request_id] = [lp.logprobs[0] for lp in out.prompt_logprobs if lp]
    nll = [-s for got in scores.values() for s in got]
    assert len(nll) == sum(len(c) - 1 for c in chunks), "a window was not scored"
    return math.exp(sum(nll) / len(nll))
