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

from trio_llm.http.errors import bad_request
from trio_llm.http.structured import StructuredFields
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


ContentPart = TextPart | ImageUrlPart | InputAudioPart | RefusalPart


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False


class SamplingFields(StructuredFields, kw_only=True):
    """Fields /v1/chat/completions and /v1/completions share (OpenAI's, then vLLM's; the
    structured-output ones are http/structured.py's)."""

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
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: Int32 = 0
    request_id: RequestId | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[str | TokenId | list[TokenId]]
    max_tokens: PositiveInt | None = 16
    logprobs: TopLogprobs | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: PositiveInt | None = None


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
    TokenizeRequest,
    DetokenizeRequest,
)

# ---------------------------------------------------------------------------------------------
# Decoding

R = TypeVar("R", bound=Struct)

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_KEY_IN = re.compile(r" - at `key` in `\$\.?([^`]*)`$")


def decode_request(body: bytes, kind: type[R]) -> R:
    """Decode and type-check a JSON body; unknown fields are ignored (logged at debug level)."""
    try:
        request = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as error:
        message = str(error)
        param = None
        if match := _KEY_IN.search(message) or _AT_PATH.search(message):
            param = match.group(1) or None
            message = message[: match.start()]
        raise bad_request(f"Invalid request: {message}", param=param) from None
    except msgspec.DecodeError as error:
        raise bad_request(f"Invalid JSON body: {error}") from None
    except RecursionError:
        raise bad_request("Invalid JSON body: nested too deeply") from None
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
