"""Anthropic's Messages API on the wire (POST /v1/messages, /v1/messages/count_tokens): the
request with its content blocks, the message object the server answers, the events of its
stream, and Anthropic's error object.

Owns what a body may contain and what the server answers, as msgspec Structs in Anthropic's
shape: content blocks, deltas and stream events carry `type` as their tag, so an event names
itself in the stream's `event:` lines as Anthropic's do. Blocks this server cannot use yet
(images, documents) decode, so that the plan refuses them with a 400 naming where they are;
a block of an unknown type is a 400 from the decoder, naming its place too. Invariant: nothing
here touches Quart or the engine.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from trio_llm.http.errors import ProtocolError
from trio_llm.http.wire import Int32, PositiveInt

# ---------------------------------------------------------------------------------------------
# Request: content blocks


class TextBlockIn(Struct, tag="text", tag_field="type", kw_only=True):
    text: str
    cache_control: dict[str, Any] | None = None
    """Accepted; the prefix cache needs no breakpoints."""
    citations: list[dict[str, Any]] | None = None


class ImageBlockIn(Struct, tag="image", tag_field="type", kw_only=True):
    source: dict[str, Any] | None = None


class DocumentBlockIn(Struct, tag="document", tag_field="type", kw_only=True):
    source: dict[str, Any] | None = None


class SearchResultBlockIn(Struct, tag="search_result", tag_field="type", kw_only=True):
    source: str | None = None


class ToolUseBlockIn(Struct, tag="tool_use", tag_field="type", kw_only=True):
    """An assistant's earlier call, in the conversation's history."""

    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlockIn(Struct, tag="tool_result", tag_field="type", kw_only=True):
    tool_use_id: str
    content: str | list[ResultContentIn] | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlockIn(Struct, tag="thinking", tag_field="type", kw_only=True):
    """A thinking block passed back (as clients must with tools): not shown to the model again,
    as chat templates drop earlier turns' thinking."""

    thinking: str
    signature: str | None = None


class RedactedThinkingBlockIn(Struct, tag="redacted_thinking", tag_field="type", kw_only=True):
    data: str


ResultContentIn = TextBlockIn | ImageBlockIn | DocumentBlockIn | SearchResultBlockIn
"""What a tool result may hold."""

ContentBlockIn = (
    TextBlockIn
    | ImageBlockIn
    | DocumentBlockIn
    | SearchResultBlockIn
    | ToolUseBlockIn
    | ToolResultBlockIn
    | ThinkingBlockIn
    | RedactedThinkingBlockIn
)


class MessageIn(Struct, kw_only=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlockIn]


# ---------------------------------------------------------------------------------------------
# Request: tools, choices, thinking


class ToolIn(Struct, kw_only=True):
    """A client tool (`custom`, or no type); Anthropic's server tools (`web_search_...`,
    `bash_...`) carry another type and are refused by the plan."""

    name: str
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: str | None = None
    strict: bool | None = None
    """Accepted; a forced call's input always matches the schema."""
    cache_control: dict[str, Any] | None = None


class _ToolChoice(Struct, tag_field="type", kw_only=True):
    disable_parallel_tool_use: bool = False


class ToolChoiceAuto(_ToolChoice, tag="auto"):
    pass


class ToolChoiceAny(_ToolChoice, tag="any"):
    pass


class ToolChoiceTool(_ToolChoice, tag="tool"):
    name: str


class ToolChoiceNone(Struct, tag="none", tag_field="type"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone


class ThinkingEnabled(Struct, tag="enabled", tag_field="type", kw_only=True):
    budget_tokens: PositiveInt
    """At most this many tokens of thinking (Anthropic asks for 1024 or more; a small local
    model may be given less)."""
    display: Literal["summarized", "omitted"] | None = None


class ThinkingAdaptive(Struct, tag="adaptive", tag_field="type", kw_only=True):
    """The model decides how much to think: thinking on, no budget."""

    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(Struct, tag="disabled", tag_field="type"):
    pass


ThinkingConfig = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled


class JsonOutputFormat(Struct, kw_only=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    """Anthropic's structured outputs (`format`) and effort (on a template that reads
    `reasoning_effort`)."""

    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class Metadata(Struct, kw_only=True):
    user_id: str | None = None
    """Accepted and logged nowhere: it does not change what is generated."""


class ConversationFields(Struct, kw_only=True):
    """What decides the prompt: the fields /v1/messages and /count_tokens share. A field
    outside these is a 400 (`...: Extra inputs are not permitted`), as Anthropic answers it:
    the request types forbid unknown fields."""

    model: str
    messages: list[MessageIn]
    system: str | list[TextBlockIn] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoice | None = None
    """Default: auto with tools."""
    thinking: ThinkingConfig | None = None
    """None: the model thinks as its template does by default."""
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None
    """Accepted (automatic caching): the prefix cache needs no breakpoints."""
    speed: str | None = None
    """Accepted: the server has one speed."""
    context_management: dict[str, Any] | None = None
    """Refused with edits (the plan): clearing earlier turns would change the prompt."""
    mcp_servers: list[dict[str, Any]] | None = None
    """Refused when not empty (the plan): the server connects to no MCP server."""


class MessagesRequest(ConversationFields, kw_only=True, forbid_unknown_fields=True):
    """Anthropic's fields (its SDK's `MessageCreateParams`): those that change the answer are
    built or refused by the plan; those that cannot (service_tier, inference_geo, container
    without a server tool, diagnostics) are accepted."""

    max_tokens: PositiveInt
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int32 | None = None
    metadata: Metadata | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    container: str | dict[str, Any] | None = None
    """Where Anthropic's code-execution tool runs; server tools are refused."""
    diagnostics: dict[str, Any] | None = None

    # What the request skeleton reads of every generating request (generate/endpoint.py).
    @property
    def request_id(self) -> str | None:
        return None

    @property
    def priority(self) -> int:
        return 0


class CountTokensRequest(ConversationFields, kw_only=True, forbid_unknown_fields=True):
    pass


# ---------------------------------------------------------------------------------------------
# Response


class TextBlock(Struct, tag="text", tag_field="type"):
    text: str


class ThinkingBlock(Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str


class ToolUseBlock(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageUsage(Struct, kw_only=True):
    input_tokens: int
    """The prompt's tokens not read from the prefix cache (Anthropic's split)."""
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    """The prompt's tokens served from the prefix cache."""


class Message(Struct, kw_only=True):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class TokenCount(Struct):
    input_tokens: int


# ---------------------------------------------------------------------------------------------
# Stream events


class TextDelta(Struct, tag="text_delta", tag_field="type"):
    text: str


class InputJsonDelta(Struct, tag="input_json_delta", tag_field="type"):
    partial_json: str


class ThinkingDelta(Struct, tag="thinking_delta", tag_field="type"):
    thinking: str


class SignatureDelta(Struct, tag="signature_delta", tag_field="type"):
    signature: str


BlockDelta = TextDelta | InputJsonDelta | ThinkingDelta | SignatureDelta


class MessageStart(Struct, tag="message_start", tag_field="type"):
    message: Message


class ContentBlockStart(Struct, tag="content_block_start", tag_field="type"):
    index: int
    content_block: ContentBlock


class ContentBlockDelta(Struct, tag="content_block_delta", tag_field="type"):
    index: int
    delta: BlockDelta


class ContentBlockStop(Struct, tag="content_block_stop", tag_field="type"):
    index: int


class StopDelta(Struct):
    stop_reason: StopReason | None
    stop_sequence: str | None = None


class OutputUsage(Struct, kw_only=True, omit_defaults=True):
    """A message_delta's usage: cumulative totals, the input's too (the prefix cache's share
    is known only once the prompt has run)."""

    output_tokens: int
    input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessageDelta(Struct, tag="message_delta", tag_field="type"):
    delta: StopDelta
    usage: OutputUsage


class MessageStop(Struct, tag="message_stop", tag_field="type"):
    pass


class Ping(Struct, tag="ping", tag_field="type"):
    pass


class ErrorDetail(Struct):
    type: str
    message: str


class ErrorEvent(Struct, tag="error", tag_field="type"):
    """A failure after the stream's 200 went out; also the body of every error response."""

    error: ErrorDetail


StreamEvent = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | ErrorEvent
)

WIRE_TYPES: tuple[type[Struct], ...] = (
    MessagesRequest,
    CountTokensRequest,
    Message,
    TokenCount,
    *StreamEvent.__args__,  # type: ignore[attr-defined]
)
"""What /openapi.json shows of the Messages API."""


# ---------------------------------------------------------------------------------------------
# Errors

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_object(error: ProtocolError) -> ErrorEvent:
    """`error` in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, its
    type from the status (`api_error` for any other 5xx). The shape has no `param`: the
    parameter leads the message instead."""
    kind = _ERROR_TYPES.get(error.status)
    if kind is None:
        kind = "api_error" if error.status >= 500 else "invalid_request_error"
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    return ErrorEvent(ErrorDetail(kind, message))


def error_body(error: ProtocolError) -> bytes:
    return msgspec.json.encode(error_object(error))
