"""The builders that fill OpenAI's response types from `RequestOutput`s.

Owns how outputs become what a client reads: logprobs in both of OpenAI's layouts, usage (with
the prefix cache's cached_tokens), the complete responses, the chunks of a stream, and vLLM's
additions that clients read (stop_reason, prompt_logprobs, return_token_ids' token ids,
continuous usage). `Shape` is what one request asks of them. Invariant: nothing here awaits
anything or touches Quart, so a stream's whole lifecycle (role chunk, deltas, usage chunk) is
tested with plain values, without a server.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from msgspec import UNSET, UnsetType

from trio_llm.http.errors import ProtocolError
from trio_llm.http.responses import (
    SSE_DONE,
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
    FunctionCallOut,
    FunctionDeltaOut,
    PromptLogprob,
    PromptLogprobs,
    PromptTokensDetails,
    ToolCallDeltaOut,
    ToolCallOut,
    TopLogprob,
    Usage,
)
from trio_llm.http.tools import ToolCallDelta, ToolCallParser
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


# ---------------------------------------------------------------------------------------------
# Complete responses


class _Usage:
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """What one request's responses and chunks carry beyond the generated text."""

    response_id: str
    model: str
    created: int
    system_fingerprint: str | None = None
    n: int = 1
    logprobs: int | None = None
    """Alternatives per generated token (chat top_logprobs, completions logprobs); None: none."""
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field: alternatives per prompt token; None: not returned."""
    return_token_ids: bool = False
    include_usage: bool = False
    continuous_usage: bool = False

    def head(self) -> dict[str, Any]:
        """The fields every response and chunk of the request repeats."""
        return {
            "id": self.response_id,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
        }


def _token_ids(shape: Shape, ids: list[int]) -> list[int] | UnsetType:
    return list(ids) if shape.return_token_ids else UNSET


def _ids_to_send(shape: Shape, output: CompletionOutput) -> bool:
    return shape.return_token_ids and bool(output.token_ids)


NewParser = Callable[[], ToolCallParser | None]
"""A fresh tool-call parser for one choice (None: its calls are not read)."""


def _finish_reason(reason: str | None, calls: bool) -> str | None:
    """OpenAI's `tool_calls` for an answer that ended by itself after calling tools."""
    return "tool_calls" if calls and reason == "stop" else reason


def _message(text: str, new_parser: NewParser | None) -> tuple[ChatMessageOut, bool]:
    parser = new_parser() if new_parser is not None else None
    if parser is None:
        return ChatMessageOut("assistant", text), False
    parser.feed(text)
    content, calls = parser.finish()
    if not calls:
        return ChatMessageOut("assistant", content), False
    out = [ToolCallOut(id=c.id, function=FunctionCallOut(c.name, c.arguments)) for c in calls]
    return ChatMessageOut("assistant", content if content.strip() else None, tool_calls=out), True


def chat_response(
    shape: Shape,
    output: RequestOutput,
    *,
    echo_text: str | None = None,
    new_parser: NewParser | None = None,
) -> ChatCompletionResponse:
    """`echo_text` (chat echo) starts every choice's content; `new_parser`: read each
    choice's tool calls into `message.tool_calls`."""
    usage = _Usage()
    usage.add(0, output)
    choices = []
    for o in sorted(output.outputs, key=lambda o: o.index):
        message, calls = _message((echo_text or "") + o.text, new_parser)
        choices.append(
            ChatChoice(
                index=o.index,
                message=message,
                logprobs=None
                if shape.logprobs is None
                else chat_logprobs(o.logprobs or (), shape.logprobs),
                finish_reason=_finish_reason(o.finish_reason, calls),
                stop_reason=o.stop_reason,
                token_ids=_token_ids(shape, o.token_ids),
            )
        )
    response = ChatCompletionResponse(
        **shape.head(),
        choices=choices,
        usage=usage.usage(),
        prompt_token_ids=_token_ids(shape, output.prompt_token_ids),
    )
    if shape.prompt_logprobs is not None:
        response.prompt_logprobs = prompt_logprobs(
            output.prompt_logprobs or (), shape.prompt_logprobs
        )
    return response


def completion_response(
    shape: Shape,
    outputs: list[RequestOutput],
    *,
    echo_texts: list[str] | None = None,
    first_tokens: list[str] | None = None,
) -> CompletionResponse:
    """`outputs[i]` is prompt i's finished request; choice index is `i * n + output.index`.
    With echo, `echo_texts[i]` starts prompt i's choices and `first_tokens[i]` is the text of
    its first token (listed in the logprobs)."""
    usage = _Usage()
    choices = []
    for i, output in enumerate(outputs):
        usage.add(i, output)
        for o in sorted(output.outputs, key=lambda o: o.index):
            prefix = echo_texts[i] if echo_texts is not None else ""
            lp = None
            if shape.logprobs is not None:
                prompt = output.prompt_logprobs if echo_texts is not None else None
                first = first_tokens[i] if first_tokens is not None and prompt else None
                lp = completion_logprobs(
                    prompt or (), o.logprobs or (), shape.logprobs, len(prefix), first
                )
            choice = CompletionChoice(
                index=i * shape.n + o.index,
                text=prefix + o.text,
                logprobs=lp,
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
                prompt_token_ids=_token_ids(shape, output.prompt_token_ids),
                token_ids=_token_ids(shape, o.token_ids),
            )
            if shape.prompt_logprobs is not None:
                choice.prompt_logprobs = prompt_logprobs(
                    output.prompt_logprobs or (), shape.prompt_logprobs
                )
            choices.append(choice)
    return CompletionResponse(**shape.head(), choices=choices, usage=usage.usage())


# ---------------------------------------------------------------------------------------------
# Streams

_Chunk = TypeVar("_Chunk", ChatCompletionChunk, CompletionResponse)


@dataclass
class _Stream(Generic[_Chunk]):
    """What both streams share: every chunk names the response (id, model, created,
    fingerprint); with include_usage each carries `usage: null` (with continuous_usage, the
    usage so far) and a last chunk with no choices carries the usage of the whole response.
    A failure after the 200 is one error object; `[DONE]` closes the stream either way."""

    _chunk_type: ClassVar[type[Any]]
    done: ClassVar[bytes] = SSE_DONE
    shape: Shape
    _usage: _Usage = field(default_factory=_Usage, init=False)

    def _chunk(self, choices: list[Any]) -> _Chunk:
        shape = self.shape
        usage: Usage | UnsetType | None = UNSET
        if shape.include_usage:
            usage = self._usage.usage() if shape.continuous_usage else None
        return self._chunk_type(**shape.head(), choices=choices, usage=usage)

    def begin(self) -> list[_Chunk]:
        return []

    def end(self) -> list[_Chunk]:
        if not self.shape.include_usage:
            return []
        chunk = self._chunk([])
        chunk.usage = self._usage.usage()
        return [chunk]

    def fail(self, error: ProtocolError) -> list[dict[str, Any]]:
        return [error.to_dict()]


@dataclass
class ChatStream(_Stream[ChatCompletionChunk]):
    """Chunks of one streamed chat completion, fed with DELTA outputs as they arrive."""

    _chunk_type = ChatCompletionChunk
    prompt_token_ids: list[int] = field(default_factory=list)
    """Sent on the first chunk with return_token_ids."""
    echo_text: str | None = None
    """Chat echo: sent as each choice's first content."""
    new_parser: NewParser | None = None
    """Read each choice's tool calls: their text becomes `tool_calls` deltas."""
    _parsers: dict[int, ToolCallParser | None] = field(default_factory=dict, init=False)
    _called: set[int] = field(default_factory=set, init=False)
    """The choices that have called a tool."""

    def _delta(self, o: CompletionOutput) -> ChatDelta:
        """The choice's delta: its text, or with a parser the content and the call deltas."""
        if self.new_parser is None:
            return ChatDelta(content=o.text) if o.text else ChatDelta()
        if o.index not in self._parsers:
            self._parsers[o.index] = self.new_parser()
        parser = self._parsers[o.index]
        if parser is None:
            return ChatDelta(content=o.text) if o.text else ChatDelta()
        content, deltas = parser.feed(o.text)
        if o.finished:
            more, last = parser.end()
            content, deltas = content + more, deltas + last
        delta = ChatDelta(content=content) if content else ChatDelta()
        if deltas:
            self._called.add(o.index)
            delta.tool_calls = [_call_delta(d) for d in _merged(deltas)]
        return delta

    def begin(self) -> list[ChatCompletionChunk]:
        """The first chunk of every choice carries the role; with echo the next one the echoed
        text."""
        if self.prompt_token_ids:  # continuous usage counts the prompt from the first chunk
            self._usage.prompt(0, len(self.prompt_token_ids))
        chunks = [
            self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
            for i in range(self.shape.n)
        ]
        if chunks and self.shape.return_token_ids:
            chunks[0].prompt_token_ids = list(self.prompt_token_ids)
        if self.echo_text:
            chunks += [
                self._chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=self.echo_text))])
                for i in range(self.shape.n)
            ]
        return chunks

    def feed(self, prompt_index: int, output: RequestOutput) -> list[ChatCompletionChunk]:
        """`prompt_index` is always 0 for chat; it keeps one signature for both streams."""
        self._usage.add(prompt_index, output)
        shape = self.shape
        top = shape.logprobs
        chunks = []
        for o in output.outputs:
            if not o.text and not o.finished and not o.logprobs and not _ids_to_send(shape, o):
                continue
            delta = self._delta(o)
            held = delta.content is UNSET and delta.tool_calls is UNSET
            if held and not o.finished and not o.logprobs and not _ids_to_send(shape, o):
                continue  # all of it held back (the start of a tag, perhaps)
            lp = chat_logprobs(o.logprobs, top) if top is not None and o.logprobs else None
            choice = ChatChunkChoice(
                index=o.index,
                delta=delta,
                logprobs=lp,
                finish_reason=_finish_reason(o.finish_reason, o.index in self._called),
                stop_reason=o.stop_reason,
                token_ids=_token_ids(shape, o.token_ids),
            )
            chunks.append(self._chunk([choice]))
        return chunks


@dataclass
class CompletionStream(_Stream[CompletionResponse]):
    """Chunks of one streamed text completion over one or more prompts."""

    _chunk_type = CompletionResponse
    echo_texts: list[str] | None = None
    first_tokens: list[str] | None = None
    """With echo: the text of each prompt's first token (listed in the logprobs)."""
    _offsets: dict[int, int] = field(default_factory=dict, init=False)
    """Characters sent so far per choice: where the next token's text_offset starts."""

    def feed(self, prompt_index: int, output: RequestOutput) -> list[CompletionResponse]:
        self._usage.add(prompt_index, output)
        shape = self.shape
        chunks = []
        for o in output.outputs:
            choice = prompt_index * shape.n + o.index
            first = choice not in self._offsets
            offset = self._offsets.get(choice, 0)
            echo = ""
            prompt: list[PositionLogprobs | None] = []
            first_token = None
            if first and self.echo_texts is not None:
                echo = self.echo_texts[prompt_index]
                prompt = list(output.prompt_logprobs or ())
                if prompt and self.first_tokens is not None:
                    first_token = self.first_tokens[prompt_index]
            text = echo + o.text
            if not text and not o.finished and not o.logprobs and not _ids_to_send(shape, o):
                continue
            lp = None
            if shape.logprobs is not None:
                lp = completion_logprobs(
                    prompt, o.logprobs or (), shape.logprobs, offset + len(echo), first_token
                )
            self._offsets[choice] = offset + len(text)
            out = CompletionChoice(
                index=choice,
                text=text,
                logprobs=lp,
                finish_reason=o.finish_reason,
                stop_reason=o.stop_reason,
                token_ids=_token_ids(shape, o.token_ids),
            )
            if first and shape.return_token_ids:
                out.prompt_token_ids = list(output.prompt_token_ids)
            chunks.append(self._chunk([out]))
        return chunks


def _merged(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """One delta per call in a chunk: a call's start and its first fragment travel together."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index and d.id is None:
            last = out[-1]
            out[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + d.arguments)
        else:
            out.append(d)
    return out


def _call_delta(delta: ToolCallDelta) -> ToolCallDeltaOut:
    if delta.id is None:
        return ToolCallDeltaOut(
            index=delta.index, function=FunctionDeltaOut(arguments=delta.arguments)
        )
    return ToolCallDeltaOut(
        index=delta.index,
        id=delta.id,
        type="function",
        function=FunctionDeltaOut(name=delta.name or "", arguments=delta.arguments),
    )


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
