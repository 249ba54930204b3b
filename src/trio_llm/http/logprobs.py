"""Logprobs in the layouts clients read: chat's (per token, with its bytes and top
alternatives; the Responses API uses it too), legacy completions' (parallel lists with text
offsets, echoed prompt tokens first), and vLLM's `prompt_logprobs` (per prompt position, by
token id).

Invariant: JSON has no -inf, so an impossible token's logprob is sent as -9999.0, as other
OpenAI-compatible servers send it; nothing here awaits anything or touches Quart.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import msgspec
from msgspec import Struct

from trio_llm.outputs import Logprob, PositionLogprobs


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes_: list[int] | None = msgspec.field(name="bytes")


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes_: list[int] | None = msgspec.field(name="bytes")
    top_logprobs: list[TopLogprob] = msgspec.field(default_factory=list)


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob] | None


class PromptLogprob(Struct):
    """vLLM's shape for one candidate at one prompt position (`prompt_logprobs`)."""

    logprob: float
    rank: int | None
    decoded_token: str


PromptLogprobs = list[dict[int, PromptLogprob] | None]
"""Per prompt position, the prompt's own token and the top alternatives, by token id; the
first position is null (no context)."""


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


# ---------------------------------------------------------------------------------------------
# Built from the engine's outputs

_BYTE_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def token_bytes(decoded: str) -> list[int]:
    """The raw bytes of a token; partial UTF-8 sequences arrive spelled `bytes:\\xNN...`."""
    if decoded.startswith("bytes:"):
        return [int(h, 16) for h in _BYTE_ESCAPE.findall(decoded)]
    return list(decoded.encode("utf-8", errors="surrogatepass"))


def _finite(logprob: float) -> float:
    """JSON has no -inf; OpenAI-compatible servers send -9999.0 for an impossible token."""
    return logprob if math.isfinite(logprob) else -9999.0


def _top(entry: Logprob) -> TopLogprob:
    return TopLogprob(entry.decoded, _finite(entry.logprob), token_bytes(entry.decoded))


def chat_logprobs(positions: Iterable[PositionLogprobs], top_n: int) -> ChatLogprobs:
    return ChatLogprobs(
        [
            ChatTokenLogprob(
                p.chosen.decoded,
                _finite(p.chosen.logprob),
                token_bytes(p.chosen.decoded),
                [_top(t) for t in p.top[:top_n]],
            )
            for p in positions
        ]
    )


def completion_logprobs(
    prompt: Sequence[PositionLogprobs | None],
    generated: Iterable[PositionLogprobs],
    top_n: int,
    generated_offset: int,
    first_token: str | None = None,
) -> CompletionLogprobs:
    """Legacy completions logprobs. `generated_offset` is where the generated text starts in
    the choice's text; echoed prompt tokens are laid out backwards from there. The first prompt
    token has no logprob (no context): with `first_token`, its text, it is listed with null
    logprobs, as OpenAI lists it."""
    scored = [p for p in prompt if p is not None]
    out = CompletionLogprobs([], [], [], [])
    echoed = sum(len(p.chosen.decoded) for p in scored) + len(first_token or "")
    offset = max(0, generated_offset - echoed)
    if first_token is not None:
        out.tokens.append(first_token)
        out.token_logprobs.append(None)
        out.top_logprobs.append(None)
        out.text_offset.append(offset)
        offset += len(first_token)
    for p in (*scored, *generated):
        out.tokens.append(p.chosen.decoded)
        out.token_logprobs.append(_finite(p.chosen.logprob))
        top = {t.decoded: _finite(t.logprob) for t in p.top[:top_n]}
        top.setdefault(p.chosen.decoded, _finite(p.chosen.logprob))
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(p.chosen.decoded)
    return out


def _candidate(entry: Logprob) -> PromptLogprob:
    return PromptLogprob(_finite(entry.logprob), entry.rank, entry.decoded)


def prompt_logprobs(positions: Iterable[PositionLogprobs | None], top_n: int) -> PromptLogprobs:
    """vLLM's `prompt_logprobs`: at each position the prompt's token (with its rank) and the
    `top_n` most likely, keyed by token id."""
    out: PromptLogprobs = []
    for p in positions:
        if p is None:
            out.append(None)
            continue
        entry = {p.chosen.token_id: _candidate(p.chosen)}
        for t in p.top[:top_n]:
            entry.setdefault(t.token_id, _candidate(t))
        out.append(entry)
    return out
