"""A Responses request validated into a plan: the conversation to render and the
`SamplingParams`, the way chat plans its requests (chat/plan.py).

Owns what the Responses fields mean for the engine: the input items (with the history of a
previous response) as chat messages (function calls as an assistant's tool_calls, their
outputs as tool messages), the function tools and tool_choice (checked by http/tools, which
renders and constrains them once the model's template is known), `max_output_tokens`, the
sampling fields with the model's defaults, `text.format` as a structured-output constraint
(http/structured.py validates it), `reasoning.effort` as the template's thinking switch
(http/reasoning), and the refusals of what this server does not build (background responses,
stored prompts, conversations). Invariant: every way a request can be wrong ends in a
`ProtocolError` naming the parameter, and nothing here touches Quart or the engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trio_llm.constraint import Constraint
from trio_llm.http.conversation import ImageRef
from trio_llm.http.errors import bad_request, not_supported
from trio_llm.http.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImagePart,
    InputItem,
    MessageItem,
    ResponsesFunctionTool,
    ResponsesRequest,
    TextConfig,
    function_tools,
    input_items,
)
from trio_llm.http.sampling import OneSequence, RequestLimits, SamplingDefaults
from trio_llm.http.structured import schema_constraint, validated
from trio_llm.http.tools import NamedFunction, ToolChoiceValue, check_tools
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError

_LOGPROBS_INCLUDE = "message.output_text.logprobs"


@dataclass(frozen=True, slots=True)
class ResponsesPlan(OneSequence):
    """A validated Responses request."""

    items: list[InputItem]
    """This request's input, as items (a string input is one user message)."""
    params: SamplingParams
    tools: list[ResponsesFunctionTool]
    tool_choice: ToolChoiceValue | None = None
    """As http/tools takes it; None: OpenAI's default (auto with tools)."""
    top_logprobs: int | None = None
    """Alternatives per output token; None: no logprobs in the response."""
    constraint_param: str | None = None
    """The field the constraint came from (`text.format.schema`), which its errors name."""
    effort: str | None = None
    """`reasoning.effort`: `none` turns thinking off where the template can, a level on."""
    history: tuple[InputItem, ...] = ()
    """What `previous_response_id` continues: the stored response's conversation and output
    (the endpoint looks it up in the store once the request is planned)."""

    @property
    def max_tokens_param(self) -> str:
        return "max_output_tokens"


def _refuse_unbuilt(request: ResponsesRequest) -> None:
    if request.background:
        raise not_supported("background", "Background responses")
    if request.conversation is not None:
        raise not_supported("conversation", "The Conversations API")
    if request.prompt is not None:
        raise not_supported("prompt", "Stored prompt templates")


def text_constraint(text: TextConfig | None) -> tuple[Constraint, str] | None:
    """`text.format` as a constraint and the parameter it came from; None for plain text."""
    format = None if text is None else text.format
    if format is None or format.type == "text":
        return None
    if format.type == "json_object":
        return validated(Constraint.json_object(), "text.format")
    if not format.name:
        raise bad_request(
            "text.format.name is required when its type is json_schema", "text.format.name"
        )
    if format.schema is None:
        raise bad_request(
            "text.format.schema is required when its type is json_schema", "text.format.schema"
        )
    return schema_constraint(format.schema, "text.format.schema")


def tool_choice(
    choice: str | dict[str, Any], given: list[ResponsesFunctionTool]
) -> ToolChoiceValue | None:
    """`tool_choice` as http/tools takes it (None: OpenAI's default), checked against the
    tools (`check_tools`: a 400 for `required` without tools, a name not among them)."""
    value: ToolChoiceValue | None
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise not_supported("tool_choice.type", f"The tool type {choice.get('type')!r}")
        name = choice.get("name")
        if not isinstance(name, str):
            raise bad_request("tool_choice.name: a function's name is required", "tool_choice.name")
        value = NamedFunction(name)
    elif choice in ("none", "auto", "required"):
        value = None if choice == "auto" else choice  # type: ignore[assignment]
    else:
        raise bad_request(
            f"tool_choice must be none, auto, required or a function, got {choice!r}",
            param="tool_choice",
        )
    check_tools([t.as_tool() for t in given], value)
    return value


def plan_responses(
    request: ResponsesRequest,
    limits: RequestLimits,
    defaults: SamplingDefaults,
) -> ResponsesPlan:
    _refuse_unbuilt(request)
    items = input_items(request.input)
    tools = function_tools(request.tools)
    choice = tool_choice(request.tool_choice, tools)
    constraint = text_constraint(request.text)
    top_logprobs = None
    if _LOGPROBS_INCLUDE in (request.include or ()):
        top_logprobs = request.top_logprobs or 0

    params = SamplingParams(
        max_tokens=request.max_output_tokens,
        **defaults.fill(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
        ),
        seed=request.seed,
        logprobs=top_logprobs,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        constraint=None if constraint is None else constraint[0],
    )
    try:
        params.validate()
    except SamplingParamsError as error:
        param = "max_output_tokens" if error.param == "max_tokens" else error.param
        raise bad_request(str(error), param=param) from None
    return ResponsesPlan(
        items,
        params,
        tools,
        tool_choice=choice,
        top_logprobs=top_logprobs,
        constraint_param=None if constraint is None else constraint[1],
        effort=None if request.reasoning is None else request.reasoning.effort,
    )


def conversation_images(history: Sequence[InputItem], items: Sequence[InputItem]) -> list[ImageRef]:
    """The conversation's pictures in the order `conversation_messages` renders their markers:
    the history's (named by previous_response_id), then this request's input's."""
    images: list[ImageRef] = []
    for k, item in enumerate((*history, *items)):
        if not isinstance(item, MessageItem) or isinstance(item.content, str):
            continue
        for j, part in enumerate(item.content):
            if not isinstance(part, InputImagePart):
                continue
            if k < len(history):
                param = "previous_response_id"
            else:
                param = f"input[{k - len(history)}].content[{j}]"
            if part.image_url is None:
                what = "a file_id" if part.file_id is not None else "no image_url"
                raise bad_request(
                    f"{param}: an input_image with {what} is not supported; give image_url",
                    param=param,
                )
            images.append(
                ImageRef(part.image_url, f"{param}.image_url" if k >= len(history) else param)
            )
    return images


def conversation_messages(
    instructions: str | None, history: Iterable[InputItem], items: Iterable[InputItem]
) -> list[dict[str, Any]]:
    """The chat messages of a conversation, in OpenAI's chat shape (what http/tools renders
    for the template): the instructions as a system message, then the history (a previous
    response's input and output) and this request's items, in order. Function calls join the
    assistant message before them (one turn: its text, then its calls); a call's output is a
    `tool` message; earlier thinking is left out, as chat templates leave it."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in (*history, *items):
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return messages
