"""The Responses API's wire types (POST /v1/responses): the request, its input items, the
response object with its output items, and the events of its stream.

Owns what a body may contain and what the server answers, as msgspec Structs (from which
/openapi.json is generated), in OpenAI's shape: output items and stream events carry `type` as
their tag, so an event names itself in the stream's `event:` lines. Input items and tools are
read item by item (`input_items`, `function_tools`): a message item may leave out its `type`,
which a tagged union cannot, and an item or tool this server cannot use gets a 400 naming
where it is and what it is, never a generic decode error. Invariant: nothing here touches
Quart or the engine; every malformed item ends in a `ProtocolError` naming its parameter.

Why over 400 lines: it is one API's whole schema (some forty short Structs in OpenAI's shape),
and its parts are typed in terms of one another: the response object echoes the request's own
types (TextConfig, Reasoning, ResponsesFunctionTool), its message items reuse the input's
OutputTextPart, and every stream event carries the response, one of its output items or one of
their parts. Each API folder keeps its wire types in one protocol.py that ends with the
WIRE_TYPES /openapi.json shows (http/__init__.py); the stream events in a module of their own
would import the response's types, and this one would import the events back for WIRE_TYPES.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from trio_llm.http import tools
from trio_llm.http.conversation import IMAGE_MARKER, RefusalPart
from trio_llm.http.errors import bad_request, not_supported
from trio_llm.http.logprobs import ChatTokenLogprob
from trio_llm.http.wire import FunctionName, Int32, Int64, PositiveInt, RequestId, TopLogprobs

# ---------------------------------------------------------------------------------------------
# Request


class TextFormat(Struct, kw_only=True, omit_defaults=True):
    """`text.format`: plain text, any JSON object, or JSON matching a schema (flat: the schema's
    name and body sit beside `type`, unlike chat's `response_format.json_schema`)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None
    """Accepted; the schema is always enforced."""


class TextConfig(Struct, kw_only=True, omit_defaults=True):
    format: TextFormat = msgspec.field(default_factory=lambda: TextFormat(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = None
    """Accepted and echoed; it does not change what this server generates."""


class Reasoning(Struct, kw_only=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(Struct, kw_only=True):
    """OpenAI's fields this server builds, then vLLM's extensions. Unknown fields are ignored;
    known ones that would change the output and are not built are refused by
    `plan_responses` (plan.py)."""

    input: str | list[dict[str, Any]]
    """A user message's text, or a list of items: messages (`input_text` parts, or
    `output_text` for the assistant's), `function_call` and `function_call_output`."""
    model: str | None = None
    instructions: str | None = None
    """A system message ahead of the conversation; not carried over by previous_response_id."""
    max_output_tokens: PositiveInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_tool_calls: PositiveInt | None = None
    text: TextConfig | None = None
    store: bool = True
    """Keep the response in the server's memory (bounded, --responses-store-size), for
    GET /v1/responses/{id} and previous_response_id."""
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    stream: bool = False
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: Reasoning | None = None
    background: bool = False
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    top_logprobs: TopLogprobs | None = None
    """Alternatives per token, with `include: ["message.output_text.logprobs"]` (without
    it, as OpenAI does, no logprobs are returned)."""
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's extensions, same names and meaning.
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    seed: Int64 | None = None
    priority: Int32 = 0
    request_id: RequestId | None = None
    enable_response_messages: bool = False
    """The response carries `input_messages` (the rendered prompt) and `output_messages` (the
    generated text), each as text and token ids (vLLM's, for a model without harmony)."""


class InputTextPart(Struct, tag="input_text", tag_field="type"):
    text: str


class InputImagePart(Struct, tag="input_image", tag_field="type", kw_only=True):
    """A picture, by URL (a data: URL or http(s)); a file id is not supported yet."""

    image_url: str | None = None
    file_id: str | None = None
    detail: str = "auto"


class OutputTextPart(Struct, tag="output_text", tag_field="type", kw_only=True):
    text: str
    annotations: list[dict[str, Any]] = msgspec.field(default_factory=list)
    logprobs: list[ChatTokenLogprob] = msgspec.field(default_factory=list)
    """Chat's shape: token, logprob, bytes, top_logprobs."""


class MessageItem(Struct, tag="message", tag_field="type", kw_only=True):
    """A message of the conversation: the request's own, or the assistant's from an earlier
    response."""

    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputTextPart | InputImagePart | OutputTextPart | RefusalPart]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(_part_text(p) for p in self.content)


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    """A call the model made, as an output item and as the next request's input."""

    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(Struct, tag="function_call_output", tag_field="type", kw_only=True):
    """What the caller's function returned for `call_id`."""

    call_id: str
    output: str | list[InputTextPart]
    id: str | None = None
    status: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "\n".join(p.text for p in self.output)


class ReasoningItem(Struct, tag="reasoning", tag_field="type", kw_only=True):
    """An earlier response's thinking, sent back (as the Agents SDK does): accepted and not
    shown to the model again, as chat templates drop earlier turns' thinking."""

    id: str | None = None
    summary: list[dict[str, Any]] = msgspec.field(default_factory=list)
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem

_ITEM_TYPES: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}
_PART_TYPES = ("input_text", "input_image", "output_text", "refusal")


def _part_text(part: InputTextPart | InputImagePart | OutputTextPart | RefusalPart) -> str:
    """A part as the template reads it: a picture is IMAGE_MARKER (its model's image token
    once rendered, http/generate/prompt.py)."""
    if isinstance(part, RefusalPart):
        return part.refusal
    if isinstance(part, InputImagePart):
        return IMAGE_MARKER
    return part.text


def _convert(value: Any, kind: type[Any], param: str) -> Any:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as error:
        message = str(error)
        where = param
        if " - at `$" in message:
            message, _, path = message.rpartition(" - at `$")
            where = param + path.rstrip("`")
        raise bad_request(f"Invalid request: {where}: {message}", param=where) from None


def input_items(given: str | list[dict[str, Any]], param: str = "input") -> list[InputItem]:
    """The request's input as items: a string is one user message."""
    if isinstance(given, str):
        return [MessageItem(role="user", content=given)]
    if not given:
        raise bad_request(f"{param} must not be empty", param=param)
    items = []
    for i, raw in enumerate(given):
        where = f"{param}[{i}]"
        kind = raw.get("type", "message" if "role" in raw else None)
        if not isinstance(kind, str) or kind not in _ITEM_TYPES:
            if kind is None:
                raise bad_request(f"{where}: an item needs a type (or a role)", param=where)
            raise not_supported(f"{where}.type", f"The input item type {kind!r}")
        if kind == "message" and isinstance(raw.get("content"), list):
            for j, part in enumerate(raw["content"]):
                part_type = part.get("type") if isinstance(part, dict) else None
                if part_type not in _PART_TYPES:
                    what = f"The content part type {part_type!r} (images, files, audio)"
                    raise not_supported(f"{where}.content[{j}].type", what)
        items.append(_convert({**raw, "type": kind}, _ITEM_TYPES[kind], where))
    return items


class ResponsesFunctionTool(Struct, tag="function", tag_field="type", kw_only=True):
    """A function tool in the flat Responses shape (chat nests these under `function`)."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    """Accepted; a forced call's arguments always match the schema."""

    def as_tool(self) -> tools.FunctionTool:
        """The tool as http/tools plans it."""
        return tools.FunctionTool(self.name, self.description, self.parameters)


def function_tools(given: list[dict[str, Any]] | None) -> list[ResponsesFunctionTool]:
    """The request's tools: function tools only (web search, file search, computer use,
    image generation, MCP, ... are a 400 naming the tool)."""
    found = []
    for i, raw in enumerate(given or ()):
        where = f"tools[{i}]"
        kind = raw.get("type")
        if kind != "function":
            raise not_supported(f"{where}.type", f"The tool type {kind!r}")
        found.append(_convert(raw, ResponsesFunctionTool, where))
    return found


# ---------------------------------------------------------------------------------------------
# Response


class ReasoningText(Struct, tag="reasoning_text", tag_field="type"):
    text: str


class ReasoningOut(Struct, tag="reasoning", tag_field="type", kw_only=True):
    """A thinking model's thinking (split out by --reasoning-parser), as its own item before
    the message."""

    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    summary: list[dict[str, Any]] = msgspec.field(default_factory=list)
    content: list[ReasoningText] = msgspec.field(default_factory=list)
    encrypted_content: None = None


class OutputMessage(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: str = "assistant"
    content: list[OutputTextPart] = msgspec.field(default_factory=list)


class FunctionCall(Struct, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


OutputItem = OutputMessage | FunctionCall | ReasoningOut


class InputTokensDetails(Struct):
    cached_tokens: int
    """Prompt tokens served from the prefix cache."""
    cache_write_tokens: int = 0
    """OpenAI's paid cache writes; the prefix cache is implicit and writes none."""


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(Struct):
    reason: Literal["max_output_tokens"]


class ResponseError(Struct):
    code: str
    message: str


class RawMessage(Struct, kw_only=True):
    """vLLM's `ResponseRawMessageAndToken`: a prompt or an output as the model saw or wrote
    it; where text and tokens diverge, the tokens are the truth."""

    message: str
    tokens: list[int]
    type: Literal["raw_message_tokens"] = "raw_message_tokens"


class ResponseObject(Struct, kw_only=True):
    """The response, echoing the request's parameters as OpenAI does."""

    id: str
    object: str = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    model: str
    output: list[OutputItem] = msgspec.field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: Reasoning | None = None
    store: bool = True
    temperature: float | None = None
    text: TextConfig = msgspec.field(default_factory=TextConfig)
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[ResponsesFunctionTool] = msgspec.field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    background: bool = False
    input_messages: list[RawMessage] | msgspec.UnsetType = msgspec.UNSET
    output_messages: list[RawMessage] | msgspec.UnsetType = msgspec.UNSET
    """With enable_response_messages (vLLM's): the prompt and the output, else absent."""


class DeletedResponse(Struct):
    id: str
    object: str = "response"
    deleted: bool = True


# ---------------------------------------------------------------------------------------------
# Stream events: each with an increasing sequence_number, tagged by `type`


class _Event(Struct, kw_only=True, tag_field="type"):
    sequence_number: int


class _Lifecycle(_Event):
    """An event that carries the whole response as it stands."""

    response: ResponseObject


class ResponseCreated(_Lifecycle, tag="response.created"):
    pass


class ResponseInProgress(_Lifecycle, tag="response.in_progress"):
    pass


class ResponseCompleted(_Lifecycle, tag="response.completed"):
    pass


class ResponseIncomplete(_Lifecycle, tag="response.incomplete"):
    pass


class ResponseFailed(_Lifecycle, tag="response.failed"):
    pass


class _ItemEvent(_Event):
    output_index: int
    item: OutputItem


class OutputItemAdded(_ItemEvent, tag="response.output_item.added"):
    pass


class OutputItemDone(_ItemEvent, tag="response.output_item.done"):
    pass


class _InItem(_Event):
    """An event about one output item, by its id and index."""

    item_id: str
    output_index: int


class _InPart(_InItem):
    """An event about one content part of a message."""

    content_index: int


class ContentPartAdded(_InPart, tag="response.content_part.added"):
    part: OutputTextPart | ReasoningText


class ContentPartDone(_InPart, tag="response.content_part.done"):
    part: OutputTextPart | ReasoningText


class OutputTextDelta(_InPart, tag="response.output_text.delta"):
    delta: str
    logprobs: list[ChatTokenLogprob] = msgspec.field(default_factory=list)


class OutputTextDone(_InPart, tag="response.output_text.done"):
    text: str
    logprobs: list[ChatTokenLogprob] = msgspec.field(default_factory=list)


class ReasoningTextDelta(_InPart, tag="response.reasoning_text.delta"):
    delta: str


class ReasoningTextDone(_InPart, tag="response.reasoning_text.done"):
    text: str


class FunctionCallArgumentsDelta(_InItem, tag="response.function_call_arguments.delta"):
    delta: str


class FunctionCallArgumentsDone(_InItem, tag="response.function_call_arguments.done"):
    name: str
    arguments: str


ResponseEvent = (
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
)


WIRE_TYPES: tuple[type[Struct], ...] = (
    ResponsesRequest,
    ResponseObject,
    DeletedResponse,
    MessageItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    ReasoningItem,
    ResponsesFunctionTool,
    *ResponseEvent.__args__,  # type: ignore[attr-defined]
)
"""What /openapi.json shows: the request, the response, the items, the tools and the events."""
