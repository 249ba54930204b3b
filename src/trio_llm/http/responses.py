"""OpenAI response types and the builders that fill them from `RequestOutput`s.

Owns the response side of the protocol: complete responses, SSE chunks, and the SSE framing.
Invariant: every byte a client receives for a completion is built here, in exactly OpenAI's
shape (ids, object names, choices, finish_reason, usage), from plain `RequestOutput` values;
nothing here awaits anything, so a stream's whole lifecycle (role chunk, deltas, usage chunk,
error event, [DONE]) is tested without a server.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Iterable
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from trio_llm.http.errors import ProtocolError
from trio_llm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput

_encoder = msgspec.json.Encoder()

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: Any) -> bytes:
    """One server-sent event carrying one JSON object."""
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def sse_error(error: ProtocolError) -> bytes:
    """What a stream sends when it fails after the 200 went out; [DONE] follows it."""
    return sse_event(error.to_dict())


def new_response_id(prefix: str, request_id: str | None = None) -> str:
    return f"{prefix}-{request_id or uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


# ---------------------------------------------------------------------------------------------
# Types


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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


class ChatMessageOut(Struct):
    role: str
    content: str | None
    refusal: None = None


class ChatChoice(Struct):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionResponse(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: None = None


class ChatDelta(Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChatChunkChoice(Struct):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: None = None
    usage: Usage | UnsetType | None = UNSET
    """Present (null until the last chunk) only when stream_options.include_usage is set."""


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class CompletionResponse(Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    object: str = "text_completion"
    system_fingerprint: None = None


class ModelCard(Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "trio-llm"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | UnsetType = UNSET


class DetokenizeResponse(Struct):
    prompt: str


RESPONSE_TYPES: tuple[type[Struct], ...] = (
    ChatCompletionResponse,
    ChatCompletionChunk,
    CompletionResponse,
    ModelList,
    ModelCard,
    TokenizeResponse,
    DetokenizeResponse,
)

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


class ChatStream:
    """Chunks of one streamed chat completion, fed with DELTA outputs as they arrive."""

    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created: int,
        n: int,
        top_logprobs: int | None,
        include_usage: bool,
    ) -> None:
        self._id, self._model, self._created = response_id, model, created
        self._n = n
        self._top_logprobs = top_logprobs
        self._include_usage = include_usage
        self._usage = _Usage()

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        usage: Usage | UnsetType | None = None if self._include_usage else UNSET
        return ChatCompletionChunk(self._id, self._created, self._model, choices, usage=usage)

    def begin(self) -> list[ChatCompletionChunk]:
        """The first chunk of every choice carries the role."""
        return [
            self._chunk([ChatChunkChoice(i, ChatDelta(role="assistant", content=""))])
            for i in range(self._n)
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
            if self._top_logprobs is not None and o.logprobs:
                lp = chat_logprobs(o.logprobs, self._top_logprobs)
            chunks.append(self._chunk([ChatChunkChoice(o.index, delta, lp, o.finish_reason)]))
        return chunks

    def end(self) -> list[ChatCompletionChunk]:
        """With include_usage, a last chunk with no choices carries the usage."""
        if not self._include_usage:
            return []
        chunk = self._chunk([])
        chunk.usage = self._usage.usage()
        return [chunk]


class CompletionStream:
    """Chunks of one streamed text completion over one or more prompts."""

    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created: int,
        n: int,
        logprobs: int | None,
        include_usage: bool,
        echo_texts: list[str] | None,
    ) -> None:
        self._id, self._model, self._created = response_id, model, created
        self._n = n
        self._logprobs = logprobs
        self._include_usage = include_usage
        self._echo_texts = echo_texts
        self._usage = _Usage()
        self._offsets: dict[int, int] = {}
        """Characters sent so far per choice: where the next token's text_offset starts."""

    def _chunk(self, choices: list[CompletionChoice]) -> CompletionResponse:
        usage: Usage | UnsetType | None = None if self._include_usage else UNSET
        return CompletionResponse(self._id, self._created, self._model, choices, usage=usage)

    def begin(self) -> list[CompletionResponse]:
        return []

    def feed(self, prompt_index: int, output: RequestOutput) -> list[CompletionResponse]:
        self._usage.add(prompt_index, output)
        chunks = []
        for o in output.outputs:
            choice = prompt_index * self._n + o.index
            first = choice not in self._offsets
            offset = self._offsets.get(choice, 0)
            echo = ""
            prompt: list[PositionLogprobs | None] = []
            if first and self._echo_texts is not None:
                echo = self._echo_texts[prompt_index]
                prompt = list(output.prompt_logprobs or ())
            text = echo + o.text
            if not text and not o.finished and not o.logprobs:
                continue
            lp = None
            if self._logprobs is not None:
                lp = completion_logprobs(
                    prompt, o.logprobs or (), self._logprobs, offset + len(echo)
                )
            self._offsets[choice] = offset + len(text)
            chunks.append(self._chunk([CompletionChoice(choice, text, lp, o.finish_reason)]))
        return chunks

    def end(self) -> list[CompletionResponse]:
        if not self._include_usage:
            return []
        chunk = self._chunk([])
        chunk.usage = self._usage.usage()
        return [chunk]


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
