"""The response object and the stream events of the Responses API, from `RequestOutput`s.

Owns how a generation becomes what a client reads: the response echoing the request's
parameters (`initial_response`), its status (`completed`; `incomplete` with
`incomplete_details.reason` when max_output_tokens cut it; `failed` with its error), its
output items and usage, and the event sequence of a stream: response.created,
response.in_progress, then per reasoning item (a thinking model's thinking) output_item.added,
content_part.added, reasoning_text.delta..., reasoning_text.done, content_part.done,
output_item.done, per message the same with output_text, per function call
output_item.added, function_call_arguments.delta..., function_call_arguments.done,
output_item.done, and response.completed / .incomplete / .failed, each with the next
sequence_number. One `AnswerReader` per response splits the text into thinking, message text
and calls (shared with chat and the Messages API).

Invariants: nothing here awaits anything or touches Quart, so a whole stream is tested with
plain values. A finished response (completed or incomplete, never failed) is handed to
`on_finished` exactly once, before the client sees its last event: a client that reads the
last event and then retrieves the response finds it stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec

from trio_llm.http.answer import AnswerReader, Piece
from trio_llm.http.errors import ProtocolError
from trio_llm.http.logprobs import ChatTokenLogprob, chat_logprobs
from trio_llm.http.responses.plan import ResponsesPlan
from trio_llm.http.responses.protocol import (
    ContentPartAdded,
    ContentPartDone,
    FunctionCall,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    IncompleteDetails,
    InputTokensDetails,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputMessage,
    OutputTextDelta,
    OutputTextDone,
    OutputTextPart,
    OutputTokensDetails,
    RawMessage,
    ReasoningOut,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseError,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
)
from trio_llm.http.tools import ToolCallDelta
from trio_llm.outputs import CompletionOutput, RequestOutput

OnFinished = Callable[[ResponseObject], None]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def item_id(prefix: str) -> str:
    """An output item's id: `msg_...`, `fc_...`, `rs_...`."""
    return f"{prefix}_{uuid.uuid4().hex}"


def initial_response(
    request: ResponsesRequest, plan: ResponsesPlan, *, response_id: str, model: str, created: int
) -> ResponseObject:
    """The response before any output: in progress, the request's parameters echoed (the
    sampling ones as the plan resolved them)."""
    return ResponseObject(
        id=response_id,
        created_at=created,
        status="in_progress",
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        max_tool_calls=request.max_tool_calls,
        metadata=dict(request.metadata or {}),
        model=model,
        parallel_tool_calls=request.parallel_tool_calls,
        previous_response_id=request.previous_response_id,
        reasoning=request.reasoning,
        store=request.store,
        temperature=plan.params.temperature,
        text=request.text or TextConfig(),
        tool_choice=request.tool_choice,
        tools=list(plan.tools),
        top_logprobs=request.top_logprobs,
        top_p=plan.params.top_p,
        truncation=request.truncation or "disabled",
        user=request.user,
    )


@dataclass
class _Tokens:
    """A response's usage, summed over its outputs (FINAL_ONLY or DELTA)."""

    input: int = 0
    cached: int = 0
    output: int = 0
    finish_reason: str | None = None

    def add(self, output: RequestOutput) -> None:
        self.input = max(self.input, len(output.prompt_token_ids))
        self.cached = max(self.cached, output.num_cached_tokens)
        for o in output.outputs:
            self.output += len(o.token_ids)
            self.finish_reason = o.finish_reason or self.finish_reason

    def usage(self) -> ResponseUsage:
        return ResponseUsage(
            input_tokens=self.input,
            input_tokens_details=InputTokensDetails(self.cached),
            output_tokens=self.output,
            output_tokens_details=OutputTokensDetails(),
            total_tokens=self.input + self.output,
        )


def finished(base: ResponseObject, tokens: _Tokens, output: list[OutputItem]) -> ResponseObject:
    """`base` with its output, usage and the status the finish reason gives."""
    reason = tokens.finish_reason
    response = msgspec.structs.replace(base, output=output, usage=tokens.usage())
    if reason in ("stop", None):
        response.status = "completed"
    elif reason == "length":
        response.status = "incomplete"
        response.incomplete_details = IncompleteDetails("max_output_tokens")
    else:  # abort, error
        response.status = "failed"
        response.error = ResponseError("server_error", f"The generation ended with {reason}")
    return response


def failure(error: ProtocolError) -> ResponseError:
    """A response's `error`: OpenAI's codes are a fixed list, so ours (engine_dead, ...) goes
    into the message."""
    code = {429: "rate_limit_exceeded", 400: "invalid_prompt"}.get(error.status, "server_error")
    detail = f" ({error.code})" if error.code else ""
    return ResponseError(code, error.message + detail)


def _last_item_status(response: ResponseObject) -> ItemStatus:
    """The status of the item the output ended in (the ones before it were completed)."""
    return "completed" if response.status == "completed" else "incomplete"


def _logprobs(output: CompletionOutput, top_logprobs: int | None) -> list[ChatTokenLogprob]:
    if top_logprobs is None or not output.logprobs:
        return []
    return chat_logprobs(output.logprobs, top_logprobs).content or []


def _function_call(call_id: str, name: str, arguments: str, status: ItemStatus) -> FunctionCall:
    return FunctionCall(
        id=item_id("fc"), call_id=call_id, name=name, arguments=arguments, status=status
    )


def complete_response(
    base: ResponseObject,
    output: RequestOutput,
    on_finished: OnFinished,
    top_logprobs: int | None = None,
    reader: AnswerReader | None = None,
    prompt: RawMessage | None = None,
) -> ResponseObject:
    """The response of a request that does not stream, from its finished output;
    `top_logprobs`: alternatives per token in the text's logprobs (None: none); `reader`:
    reads the thinking and the function calls out of the text (None: the text is all
    message); `prompt` (enable_response_messages): the rendered prompt, the response then
    carries it and the output as raw messages."""
    tokens = _Tokens()
    tokens.add(output)
    [o] = output.outputs
    reader = reader or AnswerReader()
    reader.feed(o.text)
    reasoning, content, calls = reader.finish()
    response = finished(base, tokens, [])
    items: list[OutputItem] = []
    if reasoning:
        items.append(_reasoning(reasoning, "completed"))
    if content or not calls:
        part = OutputTextPart(text=content, logprobs=_logprobs(o, top_logprobs))
        items.append(OutputMessage(id=item_id("msg"), status="completed", content=[part]))
    items += [_function_call(c.id, c.name, c.arguments, "completed") for c in calls]
    items[-1].status = _last_item_status(response)
    response.output = items
    if prompt is not None:
        response.input_messages = [prompt]
        response.output_messages = [RawMessage(message=o.text, tokens=list(o.token_ids))]
    if response.status != "failed":
        on_finished(response)
    return response


def _reasoning(text: str, status: ItemStatus, item: str | None = None) -> ReasoningOut:
    content = [ReasoningText(text)] if text or item is not None else []
    return ReasoningOut(id=item or item_id("rs"), status=status, content=content)


@dataclass
class ResponsesStream:
    """The events of one streamed response, fed with DELTA outputs as they arrive. Output
    items follow one another: a message's text, then each function call the parser reads (a
    message again if text follows a call); an item is done when the next one starts, the
    last at the end."""

    done: ClassVar[bytes] = b""
    """OpenAI's Responses streams end with their last event, no `[DONE]`."""
    base: ResponseObject
    on_finished: OnFinished
    top_logprobs: int | None = None
    """Alternatives per token in the deltas' and the text's logprobs; None: none."""
    reader: AnswerReader = field(default_factory=AnswerReader)
    """Reads the thinking and the function calls out of the text."""
    prompt: RawMessage | None = None
    """With enable_response_messages: the rendered prompt; the final response carries it and
    the whole output as raw messages."""
    _raw: RawMessage = field(default_factory=lambda: RawMessage(message="", tokens=[]), init=False)
    """The output so far, as text and token ids (kept only with `prompt`)."""
    _sequence: int = field(default=0, init=False)
    _tokens: _Tokens = field(default_factory=_Tokens, init=False)
    _output: list[OutputItem] = field(default_factory=list, init=False)
    """The items so far; the last is still open while `_open`."""
    _open: bool = field(default=False, init=False)
    _text: list[str] = field(default_factory=list, init=False)
    """The open item's text (a message's) or arguments (a call's) so far."""
    _logprobs: list[ChatTokenLogprob] = field(default_factory=list, init=False)
    _pending: list[ChatTokenLogprob] = field(default_factory=list, init=False)
    """Logprobs of tokens the parser holds back, sent with the next text."""

    def _event(self, kind: type[Any], **fields: Any) -> Any:
        """An event of `kind` with the next sequence number."""
        self._sequence += 1
        return kind(sequence_number=self._sequence - 1, **fields)

    def _in_item(self) -> dict[str, Any]:
        """Where the open item is: its id and index."""
        return {"item_id": self._output[-1].id, "output_index": len(self._output) - 1}

    def begin(self) -> list[Any]:
        return [
            self._event(ResponseCreated, response=self.base),
            self._event(ResponseInProgress, response=self.base),
        ]

    def _start(self, item: OutputItem) -> list[Any]:
        events = self._finish("completed") if self._open else []
        self._output.append(item)
        self._open = True
        self._text, self._logprobs = [], []
        events.append(self._event(OutputItemAdded, output_index=len(self._output) - 1, item=item))
        if isinstance(item, OutputMessage | ReasoningOut):
            part = OutputTextPart(text="") if isinstance(item, OutputMessage) else ReasoningText("")
            events.append(
                self._event(ContentPartAdded, **self._in_item(), content_index=0, part=part)
            )
        return events

    def _done_item(self, status: ItemStatus) -> OutputItem:
        """The open item as it stands, with `status`."""
        item, text = self._output[-1], "".join(self._text)
        if isinstance(item, OutputMessage):
            part = OutputTextPart(text=text, logprobs=self._logprobs)
            return OutputMessage(id=item.id, status=status, content=[part])
        if isinstance(item, ReasoningOut):
            return _reasoning(text, status, item.id)
        return FunctionCall(
            id=item.id, call_id=item.call_id, name=item.name, arguments=text, status=status
        )

    def _finish(self, status: ItemStatus) -> list[Any]:
        """The open item's done events."""
        done = self._done_item(status)
        self._output[-1], self._open = done, False
        where = self._in_item()
        if isinstance(done, OutputMessage):
            [part] = done.content
            return [
                self._event(
                    OutputTextDone, **where, content_index=0, text=part.text, logprobs=part.logprobs
                ),
                self._event(ContentPartDone, **where, content_index=0, part=part),
                self._event(OutputItemDone, output_index=where["output_index"], item=done),
            ]
        if isinstance(done, ReasoningOut):
            [thought] = done.content
            return [
                self._event(ReasoningTextDone, **where, content_index=0, text=thought.text),
                self._event(ContentPartDone, **where, content_index=0, part=thought),
                self._event(OutputItemDone, output_index=where["output_index"], item=done),
            ]
        return [
            self._event(
                FunctionCallArgumentsDone, **where, name=done.name, arguments=done.arguments
            ),
            self._event(OutputItemDone, output_index=where["output_index"], item=done),
        ]

    def _content(self, text: str, logprobs: list[ChatTokenLogprob]) -> list[Any]:
        events = []
        if not (self._open and isinstance(self._output[-1], OutputMessage)):
            events += self._start(OutputMessage(id=item_id("msg"), status="in_progress"))
        self._text.append(text)
        self._logprobs += logprobs
        delta = self._event(
            OutputTextDelta, **self._in_item(), content_index=0, delta=text, logprobs=logprobs
        )
        return [*events, delta]

    def _thought(self, text: str) -> list[Any]:
        events = []
        if not (self._open and isinstance(self._output[-1], ReasoningOut)):
            events += self._start(_reasoning("", "in_progress"))
        self._text.append(text)
        delta = self._event(ReasoningTextDelta, **self._in_item(), content_index=0, delta=text)
        return [*events, delta]

    def _call(self, delta: ToolCallDelta) -> list[Any]:
        events = []
        if delta.name is not None:  # a new call
            events += self._start(_function_call(delta.id or "", delta.name, "", "in_progress"))
        if delta.arguments:
            self._text.append(delta.arguments)
            events.append(
                self._event(FunctionCallArgumentsDelta, **self._in_item(), delta=delta.arguments)
            )
        return events

    def _read(self, piece: Piece, logprobs: list[Any]) -> list[Any]:
        """Events for what the reader gave: thinking, message text, call deltas. A token's
        logprobs go with the message text it ends up in (none with the thinking)."""
        events = []
        if piece.reasoning:
            events += self._thought(piece.reasoning)
        if self.reader.plain:
            if piece.content or logprobs:
                events += self._content(piece.content, logprobs)
        else:
            self._pending += logprobs
            if piece.content:
                events += self._content(piece.content, self._pending)
                self._pending = []
            elif piece.reasoning:
                self._pending = []
        for delta in piece.calls:
            events += self._call(delta)
        return events

    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]:
        self._tokens.add(output)
        events = []
        for o in output.outputs:
            if self.prompt is not None:
                self._raw.message += o.text
                self._raw.tokens += o.token_ids
            events += self._read(self.reader.feed(o.text), _logprobs(o, self.top_logprobs))
        return events

    def end(self) -> list[Any]:
        events = self._read(self.reader.end(), [])
        response = finished(self.base, self._tokens, [])
        if not self._output:  # nothing at all: an empty message
            events += self._start(OutputMessage(id=item_id("msg"), status="in_progress"))
        if self._open:
            events += self._finish(_last_item_status(response))
        response.output = list(self._output)
        if self.prompt is not None:
            response.input_messages, response.output_messages = [self.prompt], [self._raw]
        if response.status == "failed":
            return [*events, self._event(ResponseFailed, response=response)]
        self.on_finished(response)
        final = ResponseCompleted if response.status == "completed" else ResponseIncomplete
        return [*events, self._event(final, response=response)]

    def fail(self, error: ProtocolError) -> list[Any]:
        output = list(self._output)
        if self._open:
            output[-1] = self._done_item("incomplete")
        response = msgspec.structs.replace(
            self.base,
            status="failed",
            output=output,
            usage=self._tokens.usage(),
            error=failure(error),
        )
        return [self._event(ResponseFailed, response=response)]
