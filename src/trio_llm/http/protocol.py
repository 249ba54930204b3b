"""OpenAI request types, and the decoding of a body into one.

Owns what a request body may contain (msgspec Structs, from which /openapi.json is generated)
and its type checks; what the fields mean for the engine is plans.py. Invariant: a body that
does not decode ends in a `ProtocolError` naming the parameter (never another exception), and
nothing here touches Quart or the engine, so all of it is tested with plain values.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.structured import StructuredFields
from trio_llm.http.unsupported import refuse_unbuilt
from trio_llm.sampling_params import MAX_LOGPROBS

log = logging.getLogger(__name__)

Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
PositiveInt = Annotated[int, Meta(ge=1, le=2**31 - 1)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=2**31 - 1)]
TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
RequestId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")]

# ---------------------------------------------------------------------------------------------
# Request types


class TextPart(Struct, tag="text", tag_field="type"):
    text: str


class ImageUrlPart(Struct, tag="image_url", tag_field="type"):
    image_url: dict[str, Any] | str


class InputAudioPart(Struct, tag="input_audio", tag_field="type"):
    input_audio: dict[str, Any]


class RefusalPart(Struct, tag="refusal", tag_field="type"):
    refusal: str


class VideoUrlPart(Struct, tag="video_url", tag_field="type"):
    video_url: dict[str, Any] | str


class FilePart(Struct, tag="file", tag_field="type"):
    file: dict[str, Any]


ContentPart = TextPart | ImageUrlPart | InputAudioPart | RefusalPart | VideoUrlPart | FilePart


FunctionName = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
"""OpenAI's rule for a function's name (letters, digits, `_`, `-`; `.` too, as vLLM allows)."""


class FunctionDefinition(Struct, kw_only=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema of the arguments object; None: no arguments."""
    strict: bool | None = None
    """Accepted; a forced call's arguments always match the schema."""


class ChatTool(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(Struct, kw_only=True):
    name: FunctionName


class NamedToolChoice(Struct, kw_only=True):
    """`tool_choice` naming the one function the model must call."""

    type: Literal["function"]
    function: ToolChoiceFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCallFunction(Struct, kw_only=True):
    name: str
    arguments: str
    """The arguments object as JSON text, as the server returned it."""


class ToolCallIn(Struct, kw_only=True):
    """An assistant message's earlier call, in a conversation's history."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Struct, kw_only=True):
    role: Annotated[str, Meta(min_length=1, max_length=64)]
    """Any role the chat template understands (vLLM passes custom roles to the template);
    `developer` is rendered as `system`."""
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    """An assistant message's calls (its content may then be null)."""
    tool_call_id: str | None = None
    """A `tool` message's: the call it answers."""


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's: with include_usage, every chunk carries the usage so far."""


class SamplingFields(StructuredFields, kw_only=True):
    """Fields /v1/chat/completions and /v1/completions share (OpenAI's, then vLLM's; the
    structured-output ones are http/structured.py's). Those that would change the output but
    are not built yet are refused by unsupported.py."""

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: PositiveInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[TokenId, float] | None = None
    user: str | None = None
    # vLLM's extensions, same names and meaning.
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: NonNegativeInt = 0
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    """Keep this many prompt tokens (-1: as many as fit the context beside max_tokens)."""
    truncation_side: Literal["left", "right"] | None = None
    """`left` (the default) drops the prompt's start and keeps its last tokens."""
    prompt_logprobs: TopLogprobs | None = None
    return_token_ids: bool = False
    priority: Int32 = 0
    request_id: RequestId | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk (vLLM's `continuous_usage_stats`, which needs include_usage)."""
        return self.include_usage and self.stream_options.continuous_usage_stats  # type: ignore[union-attr]


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    echo: bool = False
    """vLLM's: the answer starts with the last message's content when that message is the
    assistant's (with continue_final_message, the text the model continues)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    """Special tokens (BOS) on top of what the chat template writes."""
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    """Default: `auto` with tools, `none` without."""
    parallel_tool_calls: bool | None = None
    """False: at most one call per answer (default: as many as the model writes)."""


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | TokenId | list[TokenId]]
    max_tokens: PositiveInt | None = 16
    logprobs: TopLogprobs | None = None
    echo: bool = False
    best_of: PositiveInt | None = None
    add_special_tokens: bool = True


class EmbeddingRequest(Struct, kw_only=True):
    input: str | list[str | TokenId | list[TokenId]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None
    # vLLM's extensions, same names and meaning.
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    """Cut longer inputs to this many tokens (-1: the model's length) instead of a 400."""
    add_special_tokens: bool = True
    priority: Int32 = 0
    request_id: RequestId | None = None


class TokenizeRequest(Struct, kw_only=True):
    """Either `prompt` (plain text) or `messages` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    """Default: true for a prompt, false for messages (the template adds its own)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


REQUEST_TYPES: tuple[type[Struct], ...] = (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    TokenizeRequest,
    DetokenizeRequest,
)

# ---------------------------------------------------------------------------------------------
# Decoding

R = TypeVar("R", bound=Struct)

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_KEY_IN = re.compile(r" - at `key` in `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")
_KEYS_ARE = {"logit_bias": "token ids"}
"""What the keys of a mapping field must be, for its error message."""


def _validation_error(message: str) -> ProtocolError:
    """msgspec's message names the path at its end (`- at `$.messages[0].role``); the 400
    names it first, as `param` and at the start of the message."""
    if match := _KEY_IN.search(message):
        param = match.group(1) or None
        detail = message[: match.start()]
        what = _KEYS_ARE.get(param or "")
        detail = f"keys must be {what} ({detail})" if what else f"invalid key ({detail})"
    elif match := _AT_PATH.search(message):
        param = match.group(1) or None
        detail = message[: match.start()]
    elif match := _MISSING.search(message):
        param, detail = match.group(1), "this field is required"
    else:
        param, detail = None, message
    named = f"{param}: {detail}" if param else detail
    return bad_request(f"Invalid request: {named}", param=param)


def decode_request(body: bytes, kind: type[R]) -> R:
    """Decode and type-check a JSON body; unknown fields are ignored (logged at debug level),
    known ones this server does not build yet are refused (unsupported.py)."""
    try:
        request = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as error:
        raise _validation_error(str(error)) from None
    except msgspec.DecodeError as error:
        raise bad_request(f"Invalid JSON body: {error}") from None
    except RecursionError:
        raise bad_request("Invalid JSON body: nested too deeply") from None
    if issubclass(kind, SamplingFields):
        refuse_unbuilt(body)
    if log.isEnabledFor(logging.DEBUG):
        _log_unknown_fields(body, kind)
    return request


def _log_unknown_fields(body: bytes, kind: type[Struct]) -> None:
    try:
        raw = msgspec.json.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - set(kind.__struct_fields__))
        if unknown:
            log.debug("ignoring unknown fields of %s: %s", kind.__name__, ", ".join(unknown))
