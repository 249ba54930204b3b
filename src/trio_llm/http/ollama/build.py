"""Ollama's answer objects, from `RequestOutput`s: one object with `done: true` for a request
that does not stream, one a line (NDJSON) for one that does.

Owns how a generation becomes what an Ollama client reads: the answer's text in
`message.content` (chat) or `response` (generate), the thinking in `thinking`, tool calls as
`message.tool_calls[].function.{name, arguments}` with arguments as an object (a stream sends
them whole, in one object before the last: Ollama's clients read calls only whole), and the
last object's `done_reason` ("stop", or "length" when max tokens or the context ended it),
counts and durations in nanoseconds (`load_duration` is 0: models are loaded when the server
starts), `created_at` in RFC 3339, and generate's `context` (the prompt's and the answer's
token ids, for a next request to continue from), and with `logprobs` each generated token's
log probability and alternatives (streamed, with the first object after the token's text
was read). A failure after the 200 is a line
`{"error": ...}`, which Ollama's clients raise. Every answer goes through one `AnswerReader`
(thinking, answer, tool calls), shared with the other APIs.

Invariant: nothing here awaits anything or touches Quart, so a whole stream is tested with
plain values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec

from trio_llm.http.answer import AnswerReader, Piece
from trio_llm.http.anthropic.build import tool_input
from trio_llm.http.errors import ProtocolError
from trio_llm.http.generate.streams import Framing
from trio_llm.http.ollama.protocol import (
    ChatChunk,
    ErrorLine,
    GenerateChunk,
    Logprob,
    MessageOut,
    OllamaToolCallOut,
    Timings,
    TokenLogprob,
    ToolCallFunctionOut,
)
from trio_llm.http.tools import ToolCall
from trio_llm.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput

_encoder = msgspec.json.Encoder()


def ndjson_line(payload: Any) -> bytes:
    return _encoder.encode(payload) + b"\n"


NDJSON = Framing(ndjson_line, "application/x-ndjson")


def rfc3339(seconds: float | None = None) -> str:
    """Ollama's `created_at`: UTC, microseconds, `Z`."""
    moment = datetime.fromtimestamp(time.time() if seconds is None else seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def done_reason(output: CompletionOutput | None) -> str:
    return "length" if output is not None and output.finish_reason == "length" else "stop"


def tool_calls(calls: list[ToolCall]) -> list[OllamaToolCallOut] | None:
    if not calls:
        return None
    return [
        OllamaToolCallOut(
            id=c.id,
            function=ToolCallFunctionOut(name=c.name, arguments=tool_input(c.arguments), index=i),
        )
        for i, c in enumerate(calls)
    ]


def logprobs(positions: list[PositionLogprobs] | None) -> list[Logprob] | None:
    """Ollama's `logprobs`: each generated token's, with its alternatives when asked for."""
    if positions is None:
        return None
    return [
        Logprob(
            token=p.chosen.decoded,
            logprob=p.chosen.logprob,
            top_logprobs=[TokenLogprob(token=t.decoded, logprob=t.logprob) for t in p.top] or None,
        )
        for p in positions
    ]


@dataclass
class Clock:
    """A request's counts and durations: its own start, and the engine's times when its
    outputs carry them."""

    started: int = field(default_factory=time.monotonic_ns)
    first: int | None = None
    """When the first output came (what prompt evaluation took, without engine times)."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    metrics: RequestMetrics | None = None

    def add(self, output: RequestOutput) -> None:
        if self.first is None:
            self.first = time.monotonic_ns()
        self.prompt_tokens = max(self.prompt_tokens, len(output.prompt_token_ids))
        self.output_tokens += sum(len(o.token_ids) for o in output.outputs)
        self.metrics = output.metrics

    def timings(self) -> Timings:
        end = time.monotonic_ns()
        first = self.first or end
        prompt, evaluation = first - self.started, end - first
        m = self.metrics
        if m is not None and m.first_token_time is not None and m.last_token_time is not None:
            engine_prompt = m.first_token_time - m.arrival_time
            engine_eval = m.last_token_time - m.first_token_time
            if engine_prompt >= 0 and engine_eval >= 0:
                prompt, evaluation = int(engine_prompt * 1e9), int(engine_eval * 1e9)
        return Timings(
            total_duration=end - self.started,
            load_duration=0,
            prompt_eval_count=self.prompt_tokens,
            prompt_eval_duration=prompt,
            eval_count=self.output_tokens,
            eval_duration=evaluation,
        )


def _final(timings: Timings) -> dict[str, Any]:
    return msgspec.structs.asdict(timings)


# ---------------------------------------------------------------------------------------------
# /api/chat


def chat_response(
    model: str, output: RequestOutput, reader: AnswerReader, clock: Clock
) -> ChatChunk:
    """The one object of a chat that does not stream."""
    clock.add(output)
    [o] = output.outputs
    reader.feed(o.text)
    reasoning, content, calls = reader.finish()
    message = MessageOut(
        role="assistant",
        content=content,
        thinking=reasoning or None,
        tool_calls=tool_calls(calls),
    )
    return ChatChunk(
        model=model,
        created_at=rfc3339(),
        message=message,
        done=True,
        done_reason=done_reason(o),
        logprobs=logprobs(o.logprobs),
        **_final(clock.timings()),
    )


@dataclass
class _Calls:
    """A stream's tool calls, put together from their deltas (sent whole at the end)."""

    calls: list[ToolCall] = field(default_factory=list)

    def add(self, piece: Piece) -> None:
        for delta in piece.calls:
            if delta.name is not None:
                self.calls.append(ToolCall(delta.id or f"call_{len(self.calls)}", delta.name, ""))
            if delta.arguments and self.calls:
                last = self.calls[-1]
                self.calls[-1] = ToolCall(last.id, last.name, last.arguments + delta.arguments)


@dataclass
class _Stream:
    """What a chat and a generate stream share: the reader, the clock, the calls, the last
    output; subclasses say how a piece and the end look."""

    framing: ClassVar[Framing] = NDJSON
    done: ClassVar[bytes] = b""
    model: str
    reader: AnswerReader
    clock: Clock
    _calls: _Calls = field(default_factory=_Calls, init=False)
    _last: CompletionOutput | None = field(default=None, init=False)
    _logprobs: list[Logprob] = field(default_factory=list, init=False)
    """Of tokens whose text no object has carried yet (held back by a reader)."""

    def begin(self) -> list[Any]:
        return []

    def _piece(self, piece: Piece) -> list[Any]:
        raise NotImplementedError

    def _read(self, piece: Piece) -> list[Any]:
        self._calls.add(piece)
        if not (piece.content or piece.reasoning):
            return []
        return self._piece(piece)

    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]:
        self.clock.add(output)
        chunks: list[Any] = []
        for o in output.outputs:
            self._logprobs += logprobs(o.logprobs) or []
            chunks += self._read(self.reader.feed(o.text))
            if o.finished:
                chunks += self._read(self.reader.end())
                self._last = o
        return self._with_logprobs(chunks)

    def _with_logprobs(self, chunks: list[Any]) -> list[Any]:
        """The logprobs of the tokens read so far go out with the first object that follows."""
        if chunks and self._logprobs:
            chunks[0].logprobs, self._logprobs = self._logprobs, []
        return chunks

    def fail(self, error: ProtocolError) -> list[ErrorLine]:
        return [ErrorLine(error.message)]


@dataclass
class ChatStream(_Stream):
    def _piece(self, piece: Piece) -> list[Any]:
        message = MessageOut(
            role="assistant", content=piece.content, thinking=piece.reasoning or None
        )
        return [ChatChunk(model=self.model, created_at=rfc3339(), message=message, done=False)]

    def end(self) -> list[Any]:
        chunks = self._read(self.reader.end())
        if calls := tool_calls(self._calls.calls):
            message = MessageOut(role="assistant", content="", tool_calls=calls)
            chunk = ChatChunk(model=self.model, created_at=rfc3339(), message=message, done=False)
            chunks.append(chunk)
        last = ChatChunk(
            model=self.model,
            created_at=rfc3339(),
            message=MessageOut(role="assistant", content=""),
            done=True,
            done_reason=done_reason(self._last),
            **_final(self.clock.timings()),
        )
        return self._with_logprobs([*chunks, last])


# ---------------------------------------------------------------------------------------------
# /api/generate


def generate_response(
    model: str, output: RequestOutput, reader: AnswerReader, clock: Clock
) -> GenerateChunk:
    """The one object of a generate that does not stream."""
    clock.add(output)
    [o] = output.outputs
    reader.feed(o.text)
    reasoning, content, _ = reader.finish()
    return GenerateChunk(
        model=model,
        created_at=rfc3339(),
        response=content,
        thinking=reasoning or None,
        done=True,
        done_reason=done_reason(o),
        context=[*output.prompt_token_ids, *o.token_ids],
        logprobs=logprobs(o.logprobs),
        **_final(clock.timings()),
    )


@dataclass
class GenerateStream(_Stream):
    _prompt: list[int] = field(default_factory=list, init=False)
    _tokens: list[int] = field(default_factory=list, init=False)

    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]:
        self._prompt = output.prompt_token_ids
        for o in output.outputs:
            self._tokens += o.token_ids
        return super().feed(prompt_index, output)

    def _piece(self, piece: Piece) -> list[Any]:
        return [
            GenerateChunk(
                model=self.model,
                created_at=rfc3339(),
                response=piece.content,
                thinking=piece.reasoning or None,
                done=False,
            )
        ]

    def end(self) -> list[Any]:
        chunks = self._read(self.reader.end())
        last = GenerateChunk(
            model=self.model,
            created_at=rfc3339(),
            response="",
            done=True,
            done_reason=done_reason(self._last),
            context=[*self._prompt, *self._tokens],
            **_final(self.clock.timings()),
        )
        return self._with_logprobs([*chunks, last])
