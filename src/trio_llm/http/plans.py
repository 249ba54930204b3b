"""OpenAI requests validated into plans: the prompts to build and the `SamplingParams`.

Owns what the fields of a decoded request mean for the engine, and every check that needs no
tokenizer: limits (`RequestLimits`), unsupported uses of known fields (legacy function
messages, best_of; whole fields not built yet are refused earlier, by unsupported.py), the
conversation's shape (tool calls and results included), the tool choice against the tools, the
sampling parameters with their defaults (`SamplingDefaults`, the model's
generation_config.json), and prompt truncation (`Truncation`). What needs the prompt's tokens
(does it fit the context, are its token ids in the vocabulary) is the client's
`InputProcessor.check_request`, which `generate()` runs. Invariant: every way a request can be
wrong ends in a `ProtocolError` naming the parameter, and nothing here touches Quart or the
engine, so all of it is tested with plain values.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trio_llm.http.errors import ProtocolError, bad_request, not_supported
from trio_llm.http.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    EmbeddingRequest,
    NamedToolChoice,
    RefusalPart,
    SamplingFields,
    TextPart,
)
from trio_llm.http.structured import constraint_of
from trio_llm.http.tools import FunctionTool, NamedFunction, ToolChoiceValue, check_tools
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask for; each is checked before the engine sees the request."""

    max_n: int = 16
    max_prompts: int = 16
    """Prompts in one /v1/completions batch."""
    max_embedding_inputs: int = 2048
    """Inputs in one /v1/embeddings request (OpenAI's own limit)."""
    max_stop: int = 16
    max_stop_length: int = 512
    max_logit_bias: int = 300
    max_bad_words: int = 128
    max_allowed_token_ids: int = 1 << 20


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request that leaves a sampling field unset gets: OpenAI's defaults, or the
    model's own recommendation (its generation_config.json, `--generation-config auto`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @classmethod
    def from_generation_config(cls, config: Mapping[str, Any]) -> SamplingDefaults:
        """The fields of a generation_config.json that vLLM's `auto` reads (do_sample is not
        consulted, as vLLM does not). A value a request could not have set (a string, a
        top_p of 0) is left out, with a warning."""
        given: dict[str, Any] = {}
        for name in cls.__slots__:  # type: ignore[attr-defined]
            value = config.get(name)
            if value is None:
                continue
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            try:
                if not numeric or (name == "top_k" and not isinstance(value, int)):
                    raise SamplingParamsError(name, f"{name} is {value!r}, not a number")
                SamplingParams(**{name: value}).validate()
            except SamplingParamsError as error:
                log.warning("generation config: ignoring %s: %s", name, error)
                continue
            given[name] = value
        return cls(**given)

    def overrides(self) -> dict[str, float]:
        """The fields that differ from OpenAI's defaults."""
        base = SamplingDefaults()
        return {
            name: getattr(self, name)
            for name in self.__slots__  # type: ignore[attr-defined]
            if getattr(self, name) != getattr(base, name)
        }


@dataclass(frozen=True, slots=True)
class Truncation:
    """vLLM's truncate_prompt_tokens and truncation_side: how many prompt tokens to keep."""

    keep: int
    """-1: as many as the context holds beside max_tokens."""
    side: str = "left"
    """`left` drops the start of the prompt (keeps its last tokens), `right` its end."""

    def apply(self, token_ids: list[int], max_model_len: int, max_tokens: int | None) -> list[int]:
        room = max_model_len - (max_tokens or 1)
        keep = room if self.keep == -1 else self.keep
        if keep > room:
            raise bad_request(
                f"truncate_prompt_tokens: {keep} is more than the context leaves for the prompt "
                f"beside max_tokens ({max_model_len} - {max_tokens or 1} = {room})",
                param="truncate_prompt_tokens",
            )
        if len(token_ids) <= keep:
            return token_ids
        return token_ids[-keep:] if self.side == "left" else token_ids[:keep]


def _truncation(request: SamplingFields) -> Truncation | None:
    keep = request.truncate_prompt_tokens
    if keep is None:
        return None
    if keep == 0:
        raise bad_request(
            "truncate_prompt_tokens: must be -1 or at least 1", param="truncate_prompt_tokens"
        )
    return Truncation(keep, request.truncation_side or "left")


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise ProtocolError(
            404,
            f"The model `{requested}` does not exist; this server serves `{served}`",
            param="model",
            code="model_not_found",
        )


def chat_messages(messages: list[ChatMessage], param: str = "messages") -> list[dict[str, Any]]:
    """The conversation as the chat template wants it: role and plain-text content, with an
    assistant's `tool_calls` and a tool message's `tool_call_id` in OpenAI's chat shape
    (http/tools renders them for the template)."""
    if not messages:
        raise bad_request(f"{param} must contain at least one message", param=param)
    rendered: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        if message.role == "function":
            raise not_supported(where, "Function messages (the legacy functions; use tools)")
        content = message.content
        if content is None and not message.tool_calls:
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
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if message.tool_calls:
            if role != "assistant":
                raise bad_request(
                    f"{where}.tool_calls: only an assistant message makes calls",
                    param=f"{where}.tool_calls",
                )
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in message.tool_calls
            ]
        if role == "tool":
            if message.tool_call_id is None:
                raise bad_request(
                    f"{where}.tool_call_id is required in a tool message",
                    param=f"{where}.tool_call_id",
                )
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None and role == "tool":
            out["name"] = message.name
        rendered.append(out)
    return rendered


def uses_tools(messages: list[dict[str, Any]]) -> bool:
    """Whether the conversation holds calls or their results (rendered by http/tools)."""
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""Arguments of `apply_chat_template` that the server sets itself."""


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    for key in kwargs or ():
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise bad_request(
                f"chat_template_kwargs may not set {key!r}", param="chat_template_kwargs"
            )


def completion_prompts(
    prompt: str | list[str | int | list[int]], limits: RequestLimits
) -> list[str | list[int]]:
    """OpenAI's four prompt forms (text, texts, token ids, lists of token ids) as a list."""
    return prompt_forms(prompt, "prompt", limits.max_prompts)


def prompt_forms(
    given: str | list[str | int | list[int]], param: str, max_count: int
) -> list[str | list[int]]:
    """The four forms OpenAI accepts for a completion's `prompt` and an embedding's `input`,
    as a list of at most `max_count`, none empty."""
    prompts: list[str | list[int]]
    if isinstance(given, str):
        prompts = [given]
    elif not given:
        raise bad_request(f"{param} must not be empty", param=param)
    elif all(isinstance(p, int) for p in given):
        prompts = [list(given)]  # type: ignore[arg-type]
    elif all(isinstance(p, str) for p in given) or all(isinstance(p, list) for p in given):
        prompts = list(given)  # type: ignore[arg-type]
    else:
        raise bad_request(
            f"{param} must be a string, a list of strings, a list of token ids, or a list of "
            "lists of token ids (not a mixture)",
            param=param,
        )
    if len(prompts) > max_count:
        raise bad_request(
            f"at most {max_count} {param}s per request, got {len(prompts)}", param=param
        )
    for i, p in enumerate(prompts):
        if len(p) == 0:
            where = param if len(prompts) == 1 else f"{param}[{i}]"
            raise bad_request(f"{where} must not be empty", param=where)
    return prompts


@dataclass(frozen=True, slots=True)
class EmbeddingPlan:
    inputs: list[str | list[int]]
    base64: bool


def plan_embedding(request: EmbeddingRequest, limits: RequestLimits) -> EmbeddingPlan:
    """What needs no model: the inputs' form and count (`dimensions` the client checks)."""
    inputs = prompt_forms(request.input, "input", limits.max_embedding_inputs)
    return EmbeddingPlan(inputs, request.encoding_format == "base64")


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    for token in token_ids:
        if token >= vocab_size:
            raise bad_request(
                f"{param} contains token id {token}, outside the vocabulary (size {vocab_size})",
                param=param,
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


def _check_fields(request: SamplingFields, limits: RequestLimits) -> None:
    """What the fields of both endpoints must satisfy beyond their types."""
    if request.stream_options is not None and not request.stream:
        raise bad_request(
            "stream_options: only allowed when stream is true", param="stream_options"
        )
    if request.prompt_logprobs is not None and request.stream:
        raise bad_request(
            "prompt_logprobs: not available when stream is true", param="prompt_logprobs"
        )
    if request.n > limits.max_n:
        raise bad_request(f"n must be at most {limits.max_n}, got {request.n}", param="n")
    if request.logit_bias and len(request.logit_bias) > limits.max_logit_bias:
        raise bad_request(
            f"logit_bias may have at most {limits.max_logit_bias} entries, "
            f"got {len(request.logit_bias)}",
            param="logit_bias",
        )
    bad_words = request.bad_words or ()
    if len(bad_words) > limits.max_bad_words:
        raise bad_request(
            f"bad_words: at most {limits.max_bad_words} words, got {len(bad_words)}",
            param="bad_words",
        )
    if any(len(word) > limits.max_stop_length for word in bad_words):
        raise bad_request(
            f"bad_words: a word may have at most {limits.max_stop_length} characters",
            param="bad_words",
        )
    allowed = request.allowed_token_ids
    if allowed is not None and len(allowed) > limits.max_allowed_token_ids:
        raise bad_request(
            f"allowed_token_ids: at most {limits.max_allowed_token_ids} ids, got {len(allowed)}",
            param="allowed_token_ids",
        )


def _sampling_params(
    request: SamplingFields,
    limits: RequestLimits,
    defaults: SamplingDefaults,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None,
    renames: dict[str, str],
) -> SamplingParams:
    _check_fields(request, limits)

    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    constraint = constraint_of(request)

    params = SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        temperature=given(request.temperature, defaults.temperature),
        top_p=given(request.top_p, defaults.top_p),
        top_k=defaults.top_k if request.top_k is None else request.top_k,
        min_p=given(request.min_p, defaults.min_p),
        seed=request.seed,
        presence_penalty=given(request.presence_penalty, 0.0),
        frequency_penalty=given(request.frequency_penalty, 0.0),
        repetition_penalty=given(request.repetition_penalty, defaults.repetition_penalty),
        logit_bias=dict(request.logit_bias) if request.logit_bias else None,
        stop=_stop_list(request.stop, limits),
        stop_token_ids=list(request.stop_token_ids or ()),
        bad_words=list(request.bad_words) if request.bad_words else None,
        allowed_token_ids=(
            None if request.allowed_token_ids is None else list(request.allowed_token_ids)
        ),
        ignore_eos=request.ignore_eos,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        constraint=None if constraint is None else constraint[0],
    )
    try:
        params.validate()
    except SamplingParamsError as error:
        raise bad_request(str(error), param=renames.get(error.param, error.param)) from None
    return params


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """A validated chat request: the conversation to render and how to sample the answer."""

    messages: list[dict[str, Any]]
    params: SamplingParams
    max_tokens_param: str
    top_logprobs: int | None
    """None: no logprobs in the response."""
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field; None: not returned."""
    echo_text: str | None = None
    """vLLM's chat echo: the last message's content, when it is the assistant's."""
    truncation: Truncation | None = None
    tools: list[FunctionTool] = field(default_factory=list)
    tool_choice: ToolChoiceValue = "none"
    """In force (OpenAI's default applied)."""
    parallel_tool_calls: bool | None = None

    @property
    def sequences(self) -> int:
        """What admission counts: one sequence per choice."""
        return self.params.n

    @property
    def with_tools(self) -> bool:
        """Whether http/tools renders the conversation (tools given, or calls in it)."""
        return bool(self.tools) or uses_tools(self.messages)


def _tools(request: ChatCompletionRequest) -> tuple[list[FunctionTool], ToolChoiceValue]:
    tools = [
        FunctionTool(t.function.name, t.function.description, t.function.parameters)
        for t in request.tools or ()
    ]
    given = request.tool_choice
    choice = NamedFunction(given.function.name) if isinstance(given, NamedToolChoice) else given
    choice = check_tools(tools, choice)
    forced = choice not in ("none", "auto")
    if forced and constraint_of(request) is not None:
        raise bad_request(
            "tool_choice: a forced call cannot be combined with a structured-output constraint "
            "(response_format, structured_outputs, guided_*)",
            param="tool_choice",
        )
    return tools, choice


def plan_chat(
    request: ChatCompletionRequest,
    limits: RequestLimits,
    defaults: SamplingDefaults = SamplingDefaults(),
) -> ChatPlan:
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
        defaults,
        max_tokens=max_tokens,
        logprobs=top_logprobs,
        prompt_logprobs=request.prompt_logprobs,
        renames={"max_tokens": max_tokens_param, "logprobs": "top_logprobs"},
    )
    echo_text = None
    if request.echo and messages[-1]["role"] == "assistant":
        echo_text = messages[-1]["content"]
    tools, tool_choice = _tools(request)
    return ChatPlan(
        messages,
        params,
        max_tokens_param,
        top_logprobs,
        prompt_logprobs=request.prompt_logprobs,
        echo_text=echo_text,
        truncation=_truncation(request),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=request.parallel_tool_calls,
    )


@dataclass(frozen=True, slots=True)
class CompletionPlan:
    """A validated completions request: its prompts (text or token ids) and how to sample."""

    prompts: list[str | list[int]]
    params: SamplingParams
    logprobs: int | None
    echo: bool
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field; None: not returned."""
    truncation: Truncation | None = None

    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"

    @property
    def sequences(self) -> int:
        """What admission counts: n choices of every prompt."""
        return self.params.n * len(self.prompts)


def plan_completion(
    request: CompletionRequest,
    limits: RequestLimits,
    defaults: SamplingDefaults = SamplingDefaults(),
) -> CompletionPlan:
    if request.best_of is not None and request.best_of != request.n:
        raise not_supported("best_of", "best_of other than n")
    prompts = completion_prompts(request.prompt, limits)
    # Echoed logprobs need the prompt's, as many alternatives as the generated tokens get.
    wanted = [request.prompt_logprobs, request.logprobs if request.echo else None]
    scored = [k for k in wanted if k is not None]
    params = _sampling_params(
        request,
        limits,
        defaults,
        max_tokens=request.max_tokens,
        logprobs=request.logprobs,
        prompt_logprobs=max(scored) if scored else None,
        renames={},
    )
    return CompletionPlan(
        prompts,
        params,
        request.logprobs,
        request.echo,
        prompt_logprobs=request.prompt_logprobs,
        truncation=_truncation(request),
    )
