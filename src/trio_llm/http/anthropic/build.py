"""Anthropic's message object and stream events, from `RequestOutput`s.

Owns how a generation becomes what an Anthropic client reads: content blocks in the order the
model wrote them (its thinking, then text and tool uses), `stop_reason` (`end_turn`,
`max_tokens`, `stop_sequence` with the sequence, `tool_use`), usage in Anthropic's split (the
prompt's tokens read from the prefix cache as `cache_read_input_tokens`, the rest as
`input_tokens`), and the event sequence of a stream: `message_start` (once the first output
says what the prefix cache served, so its usage is the final one's split), then per block
`content_block_start`, its deltas (`thinking_delta` then `signature_delta`, `text_delta`,
`input_json_delta`), `content_block_stop`, with one `ping` after the first block's start (where
Anthropic's own streams send it), then `message_delta` (stop reason, final usage) and
`message_stop`; a failure after the 200 is an `error` event. Every choice's text goes through
one `AnswerReader` (thinking, answer, tool calls), shared with chat and the Responses API.

Invariant: nothing here awaits anything or touches Quart, so a whole stream is tested with
plain values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec
import partial_json_parser

from trio_llm.http.answer import AnswerReader, Piece
from trio_llm.http.anthropic.protocol import (
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    ErrorEvent,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageStart,
    MessageStop,
    MessageUsage,
    OutputUsage,
    Ping,
    SignatureDelta,
    StopDelta,
    StopReason,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    error_object,
)
from trio_llm.http.anthropic.signing import PROCESS_KEY, sign
from trio_llm.http.errors import ProtocolError
from trio_llm.outputs import CompletionOutput, RequestOutput


def tool_use_id(call_id: str) -> str:
    """Anthropic's id of a call the tool parser named `call_...`."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object; arguments cut off by max_tokens give what
    they hold so far."""
    try:
        value = json.loads(arguments)
    except ValueError:
        try:
            value = partial_json_parser.loads(arguments)
        except Exception:  # the library raises its own and json's errors for bad prefixes
            value = {}
    return value if isinstance(value, dict) else {}


def stop_reason(output: CompletionOutput, called: bool) -> tuple[StopReason, str | None]:
    """Why the answer ended, and the stop sequence that ended it."""
    if output.finish_reason == "length":
        return "max_tokens", None
    if called:
        return "tool_use", None
    if isinstance(output.stop_reason, str):
        return "stop_sequence", output.stop_reason
    return "end_turn", None


@dataclass
class _Tokens:
    """A message's usage, summed over its outputs (FINAL_ONLY or DELTA)."""

    prompt: int = 0
    cached: int = 0
    output: int = 0

    def add(self, output: RequestOutput) -> None:
        self.prompt = max(self.prompt, len(output.prompt_token_ids))
        self.cached = max(self.cached, output.num_cached_tokens)
        self.output += sum(len(o.token_ids) for o in output.outputs)

    def usage(self) -> MessageUsage:
        return MessageUsage(
            input_tokens=self.prompt - self.cached,
            output_tokens=self.output,
            cache_read_input_tokens=self.cached,
        )


def message_response(
    response_id: str,
    model: str,
    output: RequestOutput,
    reader: AnswerReader,
    *,
    show_thinking: bool = True,
    key: bytes = PROCESS_KEY,
) -> Message:
    """The message of a request that does not stream, from its finished output;
    `show_thinking` False: thinking blocks empty but for their signature (made with `key`,
    signing.py)."""
    tokens = _Tokens()
    tokens.add(output)
    [o] = output.outputs
    reader.feed(o.text)
    reasoning, content, calls = reader.finish()
    blocks: list[ContentBlock] = []
    if reasoning:
        blocks.append(ThinkingBlock(reasoning if show_thinking else "", sign(reasoning, key)))
    if content:
        blocks.append(TextBlock(content))
    blocks += [ToolUseBlock(tool_use_id(c.id), c.name, tool_input(c.arguments)) for c in calls]
    if not blocks:  # nothing at all: one empty text block, as a client expects (as streamed)
        blocks.append(TextBlock(""))
    reason, sequence = stop_reason(o, bool(calls))
    return Message(
        id=response_id,
        model=model,
        content=blocks,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=tokens.usage(),
    )


@dataclass
class MessagesStream:
    """The events of one streamed message, fed with DELTA outputs as they arrive. Blocks follow
    one another: a block is stopped when the next one starts, the last at the end."""

    done: ClassVar[bytes] = b""
    """Anthropic's streams end with `message_stop`, no `[DONE]`."""
    response_id: str
    model: str
    prompt_tokens: int
    reader: AnswerReader
    show_thinking: bool = True
    """False: no thinking_delta events, the block's signature only."""
    key: bytes = PROCESS_KEY
    """What thinking blocks are signed with (signing.py)."""
    _tokens: _Tokens = field(default_factory=_Tokens, init=False)
    _index: int = field(default=-1, init=False)
    """The open block's index (-1: none yet)."""
    _open: str | None = field(default=None, init=False)
    """The open block's type: thinking, text or tool_use; None: no block is open."""
    _thinking: list[str] = field(default_factory=list, init=False)
    _called: bool = field(default=False, init=False)
    _last: CompletionOutput | None = field(default=None, init=False)
    _started: bool = field(default=False, init=False)
    """message_start went out."""

    def begin(self) -> list[Any]:
        """Nothing yet: message_start waits for the first output, which says how much of the
        prompt the prefix cache served, so that its usage splits the input as message_delta's
        and the unstreamed message's do."""
        return []

    def _message_start(self) -> list[Any]:
        if self._started:
            return []
        self._started = True
        tokens = self._tokens if self._tokens.prompt else _Tokens(prompt=self.prompt_tokens)
        usage = msgspec.structs.replace(tokens.usage(), output_tokens=0)
        message = Message(id=self.response_id, model=self.model, content=[], usage=usage)
        return [MessageStart(message)]

    def _start(self, block: ContentBlock, kind: str) -> list[Any]:
        events = self._stop()
        self._index += 1
        self._open = kind
        events.append(ContentBlockStart(self._index, block))
        if self._index == 0:
            events.append(Ping())
        return events

    def _stop(self) -> list[Any]:
        if self._open is None:
            return []
        events: list[Any] = []
        if self._open == "thinking":
            thought = "".join(self._thinking)
            events.append(ContentBlockDelta(self._index, SignatureDelta(sign(thought, self.key))))
            self._thinking = []
        self._open = None
        return [*events, ContentBlockStop(self._index)]

    def _read(self, piece: Piece) -> list[Any]:
        events: list[Any] = []
        if piece.reasoning:
            if self._open != "thinking":
                events += self._start(ThinkingBlock("", ""), "thinking")
            self._thinking.append(piece.reasoning)
            if self.show_thinking:
                events.append(ContentBlockDelta(self._index, ThinkingDelta(piece.reasoning)))
        if piece.content:
            if self._open != "text":
                events += self._start(TextBlock(""), "text")
            events.append(ContentBlockDelta(self._index, TextDelta(piece.content)))
        for delta in piece.calls:
            if delta.name is not None:  # a new call
                self._called = True
                call = ToolUseBlock(tool_use_id(delta.id or ""), delta.name, {})
                events += self._start(call, "tool_use")
            if delta.arguments:
                events.append(ContentBlockDelta(self._index, InputJsonDelta(delta.arguments)))
        return events

    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]:
        self._tokens.add(output)
        events = self._message_start()
        for o in output.outputs:
            events += self._read(self.reader.feed(o.text))
            if o.finished:
                events += self._read(self.reader.end())
                self._last = o
        return events

    def end(self) -> list[Any]:
        events = [*self._message_start(), *self._read(self.reader.end())]
        if self._index < 0:  # nothing at all: one empty text block, as a client expects
            events += self._start(TextBlock(""), "text")
        events += self._stop()
        reason, sequence = "end_turn", None
        if self._last is not None:
            reason, sequence = stop_reason(self._last, self._called)
        usage = self._tokens.usage()
        final = OutputUsage(
            output_tokens=usage.output_tokens,
            input_tokens=usage.input_tokens,
            cache_read_input_tokens=usage.cache_read_input_tokens,
        )
        return [*events, MessageDelta(StopDelta(reason, sequence), final), MessageStop()]

    def fail(self, error: ProtocolError) -> list[ErrorEvent]:
        return [error_object(error)]
