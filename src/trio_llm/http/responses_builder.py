"""The response object and the stream events of the Responses API, from `RequestOutput`s.

Owns how a generation becomes what a client reads: the response echoing the request's
parameters (`initial_response`), its status (`completed`; `incomplete` with
`incomplete_details.reason` when max_output_tokens cut it; `failed` with its error), its
output items and usage, and the event sequence of a stream: response.created,
response.in_progress, then per message output_item.added, content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done, and
response.completed / .incomplete / .failed, each with the next sequence_number.

Invariants: nothing here awaits anything or touches Quart, so a whole stream is tested with
plain values. A finished response (completed or incomplete, never failed) is handed to
`on_finished` exactly once, before the client sees its last event: a client that reads the
last event and then retrieves the response finds it stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from trio_llm.http.builders import chat_logprobs
from trio_llm.http.errors import ProtocolError
from trio_llm.http.protocol_responses import (
    ContentPartAdded,
    ContentPartDone,
    IncompleteDetails,
    InputTokensDetails,
    OutputItemAdded,
    OutputItemDone,
    OutputMessage,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    OutputTokensDetails,
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
from trio_llm.http.responses import ChatTokenLogprob
from trio_llm.http.responses_plan import ResponsesPlan
from trio_llm.outputs import CompletionOutput, RequestOutput

OnFinished = Callable[[ResponseObject], None]


def item_id(prefix: str) -> str:
    """An output item's id: `msg_...`, `fc_...`."""
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


def finished(base: ResponseObject, tokens: _Tokens, output: list[Any]) -> ResponseObject:
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


def _message_status(response: ResponseObject) -> Any:
    return "incomplete" if response.status != "completed" else "completed"


def _logprobs(output: CompletionOutput, top_logprobs: int | None) -> list[ChatTokenLogprob]:
    if top_logprobs is None or not output.logprobs:
        return []
    return chat_logprobs(output.logprobs, top_logprobs).content or []


def complete_response(
    base: ResponseObject,
    output: RequestOutput,
    on_finished: OnFinished,
    top_logprobs: int | None = None,
) -> ResponseObject:
    """The response of a request that does not stream, from its finished output;
    `top_logprobs`: alternatives per token in the text's logprobs (None: none)."""
    tokens = _Tokens()
    tokens.add(output)
    [o] = output.outputs
    part = OutputText(text=o.text, logprobs=_logprobs(o, top_logprobs))
    message = OutputMessage(id=item_id("msg"), status="completed", content=[part])
    response = finished(base, tokens, [message])
    message.status = _message_status(response)
    if response.status != "failed":
        on_finished(response)
    return response


@dataclass
class ResponsesStream:
    """The events of one streamed response, fed with DELTA outputs as they arrive."""

    done: ClassVar[bytes] = b""
    """OpenAI's Responses streams end with their last event, no `[DONE]`."""
    base: ResponseObject
    on_finished: OnFinished
    top_logprobs: int | None = None
    """Alternatives per token in the deltas' and the text's logprobs; None: none."""
    _sequence: int = field(default=0, init=False)
    _tokens: _Tokens = field(default_factory=_Tokens, init=False)
    _message: OutputMessage | None = field(default=None, init=False)
    _text: list[str] = field(default_factory=list, init=False)
    _logprobs: list[ChatTokenLogprob] = field(default_factory=list, init=False)

    def _event(self, kind: type[Any], **fields: Any) -> Any:
        """An event of `kind` with the next sequence number."""
        self._sequence += 1
        return kind(sequence_number=self._sequence - 1, **fields)

    def _in_part(self) -> dict[str, Any]:
        """Where the message's text is: its item, the item's index, the part's index."""
        assert self._message is not None
        return {"item_id": self._message.id, "output_index": 0, "content_index": 0}

    def begin(self) -> list[Any]:
        return [
            self._event(ResponseCreated, response=self.base),
            self._event(ResponseInProgress, response=self.base),
        ]

    def _open_message(self) -> list[Any]:
        self._message = OutputMessage(id=item_id("msg"), status="in_progress")
        return [
            self._event(OutputItemAdded, output_index=0, item=self._message),
            self._event(ContentPartAdded, **self._in_part(), part=OutputText(text="")),
        ]

    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]:
        self._tokens.add(output)
        events = []
        for o in output.outputs:
            logprobs = _logprobs(o, self.top_logprobs)
            if not o.text and not logprobs:
                continue
            if self._message is None:
                events += self._open_message()
            self._text.append(o.text)
            self._logprobs += logprobs
            events.append(
                self._event(OutputTextDelta, **self._in_part(), delta=o.text, logprobs=logprobs)
            )
        return events

    def end(self) -> list[Any]:
        events = [] if self._message is not None else self._open_message()
        assert self._message is not None
        text = "".join(self._text)
        part = OutputText(text=text, logprobs=self._logprobs)
        done = OutputMessage(id=self._message.id, status="completed", content=[part])
        response = finished(self.base, self._tokens, [done])
        done.status = _message_status(response)
        events += [
            self._event(OutputTextDone, **self._in_part(), text=text, logprobs=self._logprobs),
            self._event(ContentPartDone, **self._in_part(), part=part),
            self._event(OutputItemDone, output_index=0, item=done),
        ]
        if response.status == "failed":
            return [*events, self._event(ResponseFailed, response=response)]
        self.on_finished(response)
        final = ResponseCompleted if response.status == "completed" else ResponseIncomplete
        return [*events, self._event(final, response=response)]

    def fail(self, error: ProtocolError) -> list[Any]:
        output = []
        if self._message is not None:
            text = OutputText(text="".join(self._text))
            output = [OutputMessage(id=self._message.id, status="incomplete", content=[text])]
        response = msgspec.structs.replace(
            self.base,
            status="failed",
            output=output,
            usage=self._tokens.usage(),
            error=failure(error),
        )
        return [self._event(ResponseFailed, response=response)]
