"""The answers of a chat completion, from `RequestOutput`s: the complete chat.completion and
the chunks of a stream, with the thinking and the tool calls read out of each choice's text
(one `AnswerReader` per choice, shared with the Responses and Messages APIs).

Owns chat's side of the answer: the message (content, or tool_calls with OpenAI's
`finish_reason: tool_calls`; `reasoning_content` and vLLM's `reasoning` when the model's
thinking is split out), the role chunk and echo chunks a stream starts with, the deltas
(thinking, content and tool-call deltas, a call's start merged with its first fragment).
What chat and completions share (Shape, usage chunks, token ids) is http/choices.py's.
Invariant: nothing here awaits anything or touches Quart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from msgspec import UNSET

from trio_llm.http.answer import AnswerReader
from trio_llm.http.chat.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    FunctionCallOut,
    FunctionDeltaOut,
    ToolCallDeltaOut,
    ToolCallOut,
)
from trio_llm.http.choices import ChoiceStream, Shape, ids_to_send, returned_ids
from trio_llm.http.logprobs import chat_logprobs, prompt_logprobs
from trio_llm.http.tools import ToolCallDelta
from trio_llm.http.usage import UsageCounter
from trio_llm.outputs import CompletionOutput, RequestOutput

NewReader = Callable[[], AnswerReader]
"""A fresh reader for one choice's text (its thinking, its answer, its calls)."""


def _finish_reason(reason: str | None, calls: bool) -> str | None:
    """OpenAI's `tool_calls` for an answer that ended by itself after calling tools."""
    return "tool_calls" if calls and reason == "stop" else reason


def _message(
    text: str, reader: AnswerReader, *, echo_text: str | None, reasoning: bool
) -> tuple[ChatMessageOut, bool]:
    reader.feed(text)
    thought, content, calls = reader.finish()
    content = (echo_text or "") + content
    message = ChatMessageOut("assistant", content)
    if reasoning:
        message.reasoning_content = message.reasoning = thought
    if calls:
        message.content = content if content.strip() else None
        out = [ToolCallOut(id=c.id, function=FunctionCallOut(c.name, c.arguments)) for c in calls]
        message.tool_calls = out
    return message, bool(calls)


def chat_response(
    shape: Shape,
    output: RequestOutput,
    *,
    echo_text: str | None = None,
    new_reader: NewReader = AnswerReader,
    reasoning: bool = False,
) -> ChatCompletionResponse:
    """`echo_text` (chat echo) starts every choice's content; `new_reader` reads each choice's
    thinking and tool calls (`message.tool_calls`); `reasoning`: the message carries its
    thinking (`reasoning_content`, null when there was none)."""
    usage = UsageCounter()
    usage.add(0, output)
    choices = []
    for o in sorted(output.outputs, key=lambda o: o.index):
        message, calls = _message(o.text, new_reader(), echo_text=echo_text, reasoning=reasoning)
        choices.append(
            ChatChoice(
                index=o.index,
                message=message,
                logprobs=None
                if shape.logprobs is None
                else chat_logprobs(o.logprobs or (), shape.logprobs),
                finish_reason=_finish_reason(o.finish_reason, calls),
                stop_reason=o.stop_reason,
                token_ids=returned_ids(shape, o.token_ids),
            )
        )
    response = ChatCompletionResponse(
        **shape.head(),
        choices=choices,
        usage=usage.usage(),
        prompt_token_ids=returned_ids(shape, output.prompt_token_ids),
    )
    if shape.prompt_logprobs is not None:
        response.prompt_logprobs = prompt_logprobs(
            output.prompt_logprobs or (), shape.prompt_logprobs
        )
    return response


@dataclass
class ChatStream(ChoiceStream[ChatCompletionChunk]):
    """Chunks of one streamed chat completion, fed with DELTA outputs as they arrive."""

    _chunk_type = ChatCompletionChunk
    prompt_token_ids: list[int] = field(default_factory=list)
    """Sent on the first chunk with return_token_ids."""
    echo_text: str | None = None
    """Chat echo: sent as each choice's first content."""
    new_reader: NewReader = AnswerReader
    """Reads each choice's thinking and tool calls: they become their own deltas."""
    reasoning: bool = False
    """Send the thinking (`reasoning_content` and `reasoning` deltas)."""
    _readers: dict[int, AnswerReader] = field(default_factory=dict, init=False)
    _called: set[int] = field(default_factory=set, init=False)
    """The choices that have called a tool."""

    def _delta(self, o: CompletionOutput) -> ChatDelta:
        """The choice's delta: its thinking, its content and its call deltas."""
        reader = self._readers.get(o.index)
        if reader is None:
            reader = self._readers[o.index] = self.new_reader()
        piece = reader.feed(o.text)
        if o.finished:
            last = reader.end()
            piece.reasoning += last.reasoning
            piece.content += last.content
            piece.calls += last.calls
        delta = ChatDelta(content=piece.content) if piece.content else ChatDelta()
        if piece.reasoning and self.reasoning:
            delta.reasoning_content = delta.reasoning = piece.reasoning
        if piece.calls:
            self._called.add(o.index)
            delta.tool_calls = [_call_delta(d) for d in _merged(piece.calls)]
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
            if not o.text and not o.finished and not o.logprobs and not ids_to_send(shape, o):
                continue
            delta = self._delta(o)
            held = (
                delta.content is UNSET
                and delta.tool_calls is UNSET
                and delta.reasoning_content is UNSET
            )
            if held and not o.finished and not o.logprobs and not ids_to_send(shape, o):
                continue  # all of it held back (the start of a tag, perhaps)
            lp = chat_logprobs(o.logprobs, top) if top is not None and o.logprobs else None
            choice = ChatChunkChoice(
                index=o.index,
                delta=delta,
                logprobs=lp,
                finish_reason=_finish_reason(o.finish_reason, o.index in self._called),
                stop_reason=o.stop_reason,
                token_ids=returned_ids(shape, o.token_ids),
            )
            chunks.append(self._chunk([choice]))
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
