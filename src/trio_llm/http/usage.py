"""Token usage of a chat or text completion: OpenAI's `usage` object and the counter that
fills it from a request's outputs.

Invariant: each prompt is counted once (however many choices and chunks it has), every
generated token once, and `cached_tokens` is what the prefix cache served.
"""

from __future__ import annotations

from msgspec import Struct

from trio_llm.outputs import RequestOutput


class PromptTokensDetails(Struct):
    cached_tokens: int
    """Prompt tokens served from the prefix cache."""


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class UsageCounter:
    """Token counts of one response: each prompt counted once, every generated token once."""

    def __init__(self) -> None:
        self._prompts: dict[int, int] = {}
        self._cached: dict[int, int] = {}
        self.completion_tokens = 0

    def prompt(self, prompt_index: int, num_tokens: int) -> None:
        """Count a prompt before its first output (a stream's first chunks)."""
        self._prompts.setdefault(prompt_index, num_tokens)

    def add(self, prompt_index: int, output: RequestOutput) -> None:
        self.prompt(prompt_index, len(output.prompt_token_ids))
        cached = self._cached.get(prompt_index, 0)
        self._cached[prompt_index] = max(cached, output.num_cached_tokens)
        self.completion_tokens += sum(len(o.token_ids) for o in output.outputs)

    def usage(self) -> Usage:
        prompt = sum(self._prompts.values())
        details = PromptTokensDetails(sum(self._cached.values()))
        return Usage(prompt, self.completion_tokens, prompt + self.completion_tokens, details)
