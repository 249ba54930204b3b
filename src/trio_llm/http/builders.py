"""The builders that fill OpenAI's response types from `RequestOutput`s.

Owns how outputs become what a client reads: logprobs in both of OpenAI's layouts, usage, the
complete responses, and the chunks of a stream. Invariant: nothing here awaits anything or
touches Quart, so a stream's whole lifecycle (role chunk, deltas, usage chunk) is tested with
plain values, without a server.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from msgspec import UNSET, UnsetType

from trio_llm.http.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    TopLogprob,
    Usage,
)
from trio_llm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput

# ---------------------------------------------------------------------------------------------
# Logprobs

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
    prompt: Iterable[PositionLogprobs | None],
    generated: Iterable[PositionLogprobs],
    top_n: int,
    generated_offset: int,
) -> CompletionLogprobs:
    """Legacy completions logprobs. `generated_offset` is where the generated text starts in
    the choice's text; echoed prompt tokens are laid out backwards from there (the first prompt
    token has no logprob and is left out)."""
    prompt = [p for p in prompt if p is not None]
    out = CompletionLogprobs([], [], [], [])
    offset = max(0, generated_offset - sum(len(p.chosen.decoded) for p in prompt))
    for p in (*prompt, *generated):
        out.tokens.append(p.chosen.decoded)
        out.token_logprobs.append(_finite(p.chosen.logprob))
        top = {t.decoded: _finite(t.logprob) for t in p.top[:top_n]}
        top.setdefault(p.chosen.decoded, _finite(p.chosen.logprob))
        out.top_logprobs.append(top)
        out.text_offset.append(offset)
        offset += len(p.chosen.decoded)
    return out


# ---------------------------------------------------------------------------------------------
# Complete responses


class _Usage:
    """Token counts of one response: each prompt counted once, every generated token once."""

    def __init__(self) -> None:
        self._prompts: dict[int, int] = {}
        self.completion_tokens = 0

    def add(self, prompt_index: int, output: RequestOutput) -> None:
        self._prompts.setdefault(prompt_index, len(output.prompt_token_ids))
        self.completion_tokens += sum(len(o.token_ids) for o in output.outputs)

    def usage(self) -> Usage:
        prompt = sum(self._prompts.values())
        return Usage(prompt, self.completion_tokens, prompt + self.completion_tokens)


def chat_response(
    *,
    response_id: str,
    model: str,
    created: int,
    output: RequestOutput,
    top_logprobs: int | None,
) -> ChatCompletionResponse:
    usage = _Usage()
    usage.add(0, output)
    choices = [
        ChatChoice(
            o.index,
            ChatMessageOut("assistant", o.text),
            None if top_logprobs is None else chat_logprobs(o.logprobs or (), top_logprobs),
            o.finish_reason,
        )
        for o in sorted(output.outputs, key=lambda o: o.index)
    ]
    return ChatCompletionResponse(response_id, created, model, choices, usage.usage())


def completion_response(
    *,
    response_id: str,
    model: str,
    created: int,
    outputs: list[RequestOutput],
    n: int,
    logprobs: int | None,
    echo_texts: list[str] | None,
) -> CompletionResponse:
    """`outputs[i]` is prompt i's finished request; choice index is `i * n + output.index`."""
    usage = _Usage()
    choices = []
    for i, output in enumerate(outputs):
        usage.add(i, output)
        for o in sorted(output.outputs, key=lambda o: o.index):
            prefix = echo_texts[i] if echo_texts is not None else ""
            lp = None
            if logprobs is not None:
                prompt = output.prompt_logprobs if echo_texts is not None else None
                lp = completion_logprobs(prompt or (), o.logprobs or (), logprobs, len(prefix))
            choices.append(CompletionChoice(i * n + o.index, prefix + o.text, lp, o.finish_reason))
    return CompletionResponse(response_id, created, model, choices, usage.usage())


# ---------------------------------------------------------------------------------------------
# Streams

_Chunk = TypeVar("_Chunk", ChatCompletionChunk, CompletionResponse)


@dataclass(kw_only=True)
class _Stream(Generic[_Chunk]):
    """What both streams share: every chunk names the response (id, model, created); with
    include_usage each carries `usage: null` and a last chunk with no choices carries the
    usage of the whole response."""

    _chunk_type: ClassVar[type[Any]]
    response_id: str
    model: str
    created: int
    n: int
    include_usage: bool
    _usage: _Usage = field(default_factory=_Usage, init=False)

    def _chunk(self, choices: list[Any]) -> _Chunk:
        usage: Usage | UnsetType | None = None if self.include_usage else UNSET
        return self._chunk_type(self.response_id, self.created, self.model, choices, usage=usage)

    def begin(self) -> list[_Chunk]:
        return []

    def end(self) -> list[_Chunk]:
        if not self.include_usage:
            return []
        chunk = self._chunk([])
        chunk.usage = self._usage.usage()
        return [chunk]


@dataclass(kw_only=True)
class ChatStream(_Stream[ChatCompletionChunk]):
    """Chunks of one streamed chat completion, fed with DELTA outputs as they arrive."""

    _chunk_type = ChatCompletionChunk
    top_logprobs: int | None

    def begin(self) -> list[ChatCompletionChunk]:
        """The first chunk of every choice carries the role."""
        return [
            self._chunk([ChatChunkChoice(i, ChatDelta(role="assistant", content=""))])
            for i in range(self.n)
        ]

    def feed(self, prompt_index: int, output: RequestOutput) -> list[ChatCompletionChunk]:
        """`prompt_index` is always 0 for chat; it keeps one signature for both streams."""
        self._usage.add(prompt_index, output)
        chunks = []
        for o in output.outputs:
            if not o.text and not o.finished and not o.logprobs:
                continue
            delta = ChatDelta(content=o.text) if o.text else ChatDelta()
            lp = None
            if self.top_logprobs is not None and o.logprobs:
                lp = chat_logprobs(o.logprobs, self.top_logprobs)
            chunks.append(self._chunk([ChatChunkChoice(o.index, delta, lp, o.finish_reason)]))
        return chunks


@dataclass(kw_only=True)
class CompletionStream(_Stream[CompletionResponse]):
    """Chunks of one streamed text completion over one or more prompts."""

    _chunk_type = CompletionResponse
    logprobs: int | None
    echo_texts: list[str] | None
    _offsets: dict[int, int] = field(default_factory=dict, init=False)
    """Characters sent so far per choice: where the next token's text_offset starts."""

    def feed(self, prompt_index: int, output: RequestOutput) -> list[CompletionResponse]:
        self._usage.add(prompt_index, output)
        chunks = []
        for o in output.outputs:
            choice = prompt_index * self.n + o.index
            first = choice not in self._offsets
            offset = self._offsets.get(choice, 0)
            echo = ""
            prompt: list[PositionLogprobs | None] = []
            if first and self.echo_texts is not None:
                echo = self.echo_texts[prompt_index]
                prompt = list(output.prompt_logprobs or ())
            text = echo + o.text
            if not text and not o.finished and not o.logprobs:
                continue
            lp = None
            if self.logprobs is not None:
                lp = completion_logprobs(
                    prompt, o.logprobs or (), self.logprobs, offset + len(echo)
                )
            self._offsets[choice] = offset + len(text)
            chunks.append(self._chunk([CompletionChoice(choice, text, lp, o.finish_reason)]))
        return chunks


def merge_final(outputs: Iterable[RequestOutput]) -> RequestOutput:
    """One finished RequestOutput from a FINAL_ONLY stream, whether the n choices arrived
    together or one by one: the last output seen for each choice index wins."""
    merged: RequestOutput | None = None
    choices: dict[int, CompletionOutput] = {}
    for output in outputs:
        merged = output
        for o in output.outputs:
            choices[o.index] = o
    if merged is None:
        raise ValueError("the engine finished the request without any output")
    merged.outputs = [choices[i] for i in sorted(choices)]
    return merged
