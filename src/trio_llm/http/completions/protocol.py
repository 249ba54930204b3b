"""The wire types of POST /v1/completions: the request, and the text_completion that is both
the complete response and each chunk of a stream (as OpenAI's legacy API has it).

Invariant: nothing here touches Quart or the engine.
"""

from __future__ import annotations

from msgspec import UNSET, Struct, UnsetType

from trio_llm.http.logprobs import CompletionLogprobs, PromptLogprobs
from trio_llm.http.sampling import SamplingFields
from trio_llm.http.usage import Usage
from trio_llm.http.wire import PositiveInt, TokenId, TopLogprobs


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | TokenId | list[TokenId]]
    max_tokens: PositiveInt | None = 16
    logprobs: TopLogprobs | None = None
    echo: bool = False
    best_of: PositiveInt | None = None
    add_special_tokens: bool = True


class CompletionChoice(Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    """vLLM's: always present (null unless asked for), as its clients read it."""
    prompt_token_ids: list[int] | UnsetType = UNSET
    token_ids: list[int] | UnsetType = UNSET


class CompletionResponse(Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    object: str = "text_completion"
    system_fingerprint: str | None = None


WIRE_TYPES: tuple[type[Struct], ...] = (CompletionRequest, CompletionResponse)
"""What /openapi.json shows."""
