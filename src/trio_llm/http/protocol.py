"""OpenAI request types, and their validation into a prompt plus `SamplingParams`.

Owns the request side of the OpenAI protocol: what a body may contain (msgspec Structs, from
which /openapi.json is generated), and the checks that turn a decoded request into what the
engine takes. Invariant: every way a body can be wrong ends in a `ProtocolError` naming the
parameter (never another exception), and nothing here touches Quart or the engine, so all of
it is tested with plain values.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from trio_llm.http.errors import ProtocolError, bad_request, not_supported
from trio_llm.sampling_params import (
    MAX_LOGPROBS,
    RequestOutputKind,
    SamplingParams,
    SamplingParamsError,
)

log = logging.getLogger(__name__)

Int32 = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
PositiveInt = Annotated[int, Meta(ge=1, le=2**31 - 1)]
NonNegativeInt = Annotated[int, Meta(ge=0, le=2**31 - 1)]
TokenId = Annotated[int, Meta(ge=0, le=2**31 - 1)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS)]
RequestId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")]


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask for; each is checked before the engine sees the request."""

    max_n: int = 16
    max_prompts: int = 16
    """Prompts in one /v1/completions batch."""
    max_stop: int = 16
    max_stop_length: int = 512
    max_logit_bias: int = 300


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


class ResponseFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _SamplingFields(Struct, kw_only=True):
    """Fields /v1/chat/completions and /v1/completions share (OpenAI's, then vLLM's)."""

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


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
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


# ---------------------------------------------------------------------------------------------
# Validation


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise ProtocolError(
            404,
            f"The model `{requested}` does not exist; this server serves `{served}`",
            param="model",
            code="model_not_found",
        )


def chat_messages(messages: list[ChatMessage], param: str = "messages") -> list[dict[str, str]]:
    """The conversation as the chat template wants it: role and plain-text content."""
    if not messages:
        raise bad_request(f"{param} must contain at least one message", param=param)
    rendered = []
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        if message.role == "tool" or message.tool_calls or message.tool_call_id:
            raise not_supported(where, "Tool calling (tool messages and tool_calls)")
        content = message.content
        if content is None:
            raise bad_request(f"{where}.content is required", param=f"{where}.content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if isinstance(part, TextPart):
                    texts.append(part.text)
                elif isinstance(part, RefusalPart):
                    texts.append(part.refusal)
                else:
                    raise not_supported(f"{where}.content[{j}]", "Image and audio content")
            content = "\n".join(texts)
        role = "system" if message.role == "developer" else message.role
        rendered.append({"role": role, "content": content})
    return rendered


def completion_prompts(
    prompt: str | list[str | int | list[int]], limits: RequestLimits
) -> list[str | list[int]]:
    """OpenAI's four prompt forms (text, texts, token ids, lists of token ids) as a list."""
    prompts: list[str | list[int]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif not prompt:
        raise bad_request("prompt must not be empty", param="prompt")
    elif all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]  # type: ignore[arg-type]
    elif all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        prompts = list(prompt)  # type: ignore[arg-type]
    else:
        raise bad_request(
            "prompt must be a string, a list of strings, a list of token ids, or a list of "
            "lists of token ids (not a mixture)",
            param="prompt",
        )
    if len(prompts) > limits.max_prompts:
        raise bad_request(
            f"at most {limits.max_prompts} prompts per request, got {len(prompts)}", param="prompt"
        )
    for i, p in enumerate(prompts):
        if len(p) == 0:
            where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            raise bad_request(f"{where} must not be empty", param=where)
    return prompts


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    for token in token_ids:
        if token >= vocab_size:
            raise bad_request(
                f"{param} contains token id {token}, outside the vocabulary (size {vocab_size})",
                param=param,
            )


def fit_context(
    prompt_len: int,
    max_tokens: int | None,
    max_model_len: int,
    *,
    prompt_param: str,
    max_tokens_param: str,
) -> None:
    """The prompt must leave room for one token, and max_tokens must fit beside it."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_len} tokens (it must leave room for at least one generated token)",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but "
            f"{prompt_len + max_tokens} were requested ({prompt_len} in the prompt, "
            f"{max_tokens} for {max_tokens_param}); lower {max_tokens_param}",
            param=max_tokens_param,
            code="context_length_exceeded",
        )


def _stop_list(stop: str | list[str] | None, limits: RequestLimits) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > limits.max_stop:
        raise bad_request(f"at most {limits.max_stop} stop sequences, got {len(stops)}", "stop")
    for s in stops:
        if not s:
            raise bad_request("stop sequences must not be empty", param="stop")
        if len(s) > limits.max_stop_length:
            raise bad_request(
                f"a stop sequence may have at most {limits.max_stop_length} characters, "
                f"got {len(s)}",
                param="stop",
            )
    return stops


def _sampling_params(
    request: _SamplingFields,
    limits: RequestLimits,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None,
    renames: dict[str, str],
) -> SamplingParams:
    if request.n > limits.max_n:
        raise bad_request(f"n must be at most {limits.max_n}, got {request.n}", param="n")
    if request.logit_bias and len(request.logit_bias) > limits.max_logit_bias:
        raise bad_request(
            f"logit_bias may have at most {limits.max_logit_bias} entries, "
            f"got {len(request.logit_bias)}",
            param="logit_bias",
        )

    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    params = SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        temperature=given(request.temperature, 1.0),
        top_p=given(request.top_p, 1.0),
        top_k=request.top_k or 0,
        min_p=given(request.min_p, 0.0),
        seed=request.seed,
        presence_penalty=given(request.presence_penalty, 0.0),
        frequency_penalty=given(request.frequency_penalty, 0.0),
        repetition_penalty=given(request.repetition_penalty, 1.0),
        logit_bias=dict(request.logit_bias) if request.logit_bias else None,
        stop=_stop_list(request.stop, limits),
        stop_token_ids=list(request.stop_token_ids or ()),
        ignore_eos=request.ignore_eos,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
    )
    try:
        params.validate()
    except SamplingParamsError as error:
        raise bad_request(str(error), param=renames.get(error.param, error.param)) from None
    return params


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """A validated chat request: the conversation to render and how to sample the answer."""

    messages: list[dict[str, str]]
    params: SamplingParams
    max_tokens_param: str
    top_logprobs: int | None
    """None: no logprobs in the response."""


def plan_chat(request: ChatCompletionRequest, limits: RequestLimits) -> ChatPlan:
    if request.response_format is not None and request.response_format.type != "text":
        raise not_supported("response_format", f"response_format {request.response_format.type}")
    if request.tools or request.functions:
        raise not_supported("tools" if request.tools else "functions", "Tool calling")
    for name in ("tool_choice", "function_call"):
        choice = getattr(request, name)
        if choice is not None and choice not in ("none", "auto"):
            raise not_supported(name, "Tool calling")
    if request.top_logprobs is not None and not request.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
    if request.continue_final_message and request.add_generation_prompt:
        raise bad_request(
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
        )
    messages = chat_messages(request.messages)
    if request.continue_final_message and messages[-1]["role"] != "assistant":
        raise bad_request(
            "continue_final_message needs the last message to be the assistant's",
            param="continue_final_message",
        )
    max_tokens_param = "max_completion_tokens"
    max_tokens = request.max_completion_tokens
    if max_tokens is None:
        max_tokens_param, max_tokens = "max_tokens", request.max_tokens
    top_logprobs = (request.top_logprobs or 0) if request.logprobs else None
    params = _sampling_params(
        request,
        limits,
        max_tokens=max_tokens,
        logprobs=top_logprobs,
        prompt_logprobs=None,
        renames={"max_tokens": max_tokens_param, "logprobs": "top_logprobs"},
    )
    return ChatPlan(messages, params, max_tokens_param, top_logprobs)


@dataclass(frozen=True, slots=True)
class CompletionPlan:
    prompts: list[str | list[int]]
    params: SamplingParams
    logprobs: int | None
    echo: bool


def plan_completion(request: CompletionRequest, limits: RequestLimits) -> CompletionPlan:
    if request.suffix:
        raise not_supported("suffix", "suffix (insertion)")
    if request.best_of is not None and request.best_of != request.n:
        raise not_supported("best_of", "best_of other than n")
    prompts = completion_prompts(request.prompt, limits)
    params = _sampling_params(
        request,
        limits,
        max_tokens=request.max_tokens,
        logprobs=request.logprobs,
        prompt_logprobs=request.logprobs if request.echo else None,
        renames={},
    )
    return CompletionPlan(prompts, params, request.logprobs, request.echo)
