"""A text completion request validated into a plan: its prompts (text or token ids) and the
`SamplingParams`.

Owns what the legacy completions' own fields mean: the four prompt forms, best_of (only equal
to n), echo and its logprobs (which need the prompt's). Invariant: every way a request can be
wrong ends in a `ProtocolError` naming the parameter, and nothing here touches Quart or the
engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from trio_llm.http.completions.protocol import CompletionRequest
from trio_llm.http.errors import not_supported
from trio_llm.http.sampling import (
    OPENAI_DEFAULTS,
    RequestLimits,
    SamplingDefaults,
    Truncation,
    prompt_forms,
    sampling_params,
    truncation,
)
from trio_llm.sampling_params import SamplingParams


def completion_prompts(
    prompt: str | list[str | int | list[int]], limits: RequestLimits
) -> list[str | list[int]]:
    """OpenAI's four prompt forms (text, texts, token ids, lists of token ids) as a list."""
    return prompt_forms(prompt, "prompt", limits.max_prompts)


@dataclass(frozen=True, slots=True)
class CompletionPlan:
    """A validated completions request: its prompts (text or token ids) and how to sample."""

    prompts: list[str | list[int]]
    params: SamplingParams
    logprobs: int | None
    echo: bool
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field; None: not returned."""
    truncation: Truncation | None = None
    constraint_param: str | None = None
    """The field the structured-output constraint came from (`response_format`, ...)."""

    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"

    @property
    def sequences(self) -> int:
        """What admission counts: n choices of every prompt."""
        return self.params.n * len(self.prompts)


def plan_completion(
    request: CompletionRequest,
    limits: RequestLimits,
    defaults: SamplingDefaults = OPENAI_DEFAULTS,
) -> CompletionPlan:
    if request.best_of is not None and request.best_of != request.n:
        raise not_supported("best_of", "best_of other than n")
    prompts = completion_prompts(request.prompt, limits)
    # Echoed logprobs need the prompt's, as many alternatives as the generated tokens get.
    wanted = [request.prompt_logprobs, request.logprobs if request.echo else None]
    scored = [k for k in wanted if k is not None]
    params, constraint_param = sampling_params(
        request,
        limits,
        defaults,
        max_tokens=request.max_tokens,
        logprobs=request.logprobs,
        prompt_logprobs=max(scored) if scored else None,
        renames={},
    )
    return CompletionPlan(
        prompts,
        params,
        request.logprobs,
        request.echo,
        prompt_logprobs=request.prompt_logprobs,
        truncation=truncation(request),
        constraint_param=constraint_param,
    )
