"""OpenAI requests validated into plans: the prompts to build and the `SamplingParams`.

Owns what the fields of a decoded request mean for the engine, and every check that needs no
tokenizer: limits (`RequestLimits`), unsupported features (a clear 400, never silently
ignored), the conversation's shape, and the sampling parameters. What needs the prompt's tokens
(does it fit the context, are its token ids in the vocabulary) is the client's
`InputProcessor.check_request`, which `generate()` runs. Invariant: every way a request can be
wrong ends in a `ProtocolError` naming the parameter, and nothing here touches Quart or the
engine, so all of it is tested with plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trio_llm.http.errors import ProtocolError, bad_request, not_supported
from trio_llm.http.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    RefusalPart,
    SamplingFields,
    TextPart,
)
from trio_llm.http.structured import constraint_of
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask for; each is checked before the engine sees the request."""

    max_n: int = 16
    max_prompts: int = 16
    """Prompts in one /v1/completions batch."""
    max_stop: int = 16
    max_stop_length: int = 512
    max_logit_bias: int = 300


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
    request: SamplingFields,
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

    constraint = constraint_of(request)

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

    messages: list[dict[str, str]]
    params: SamplingParams
    max_tokens_param: str
    top_logprobs: int | None
    """None: no logprobs in the response."""

    @property
    def sequences(self) -> int:
        """What admission counts: one sequence per choice."""
        return self.params.n


def plan_chat(request: ChatCompletionRequest, limits: RequestLimits) -> ChatPlan:
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
    """A validated completions request: its prompts (text or token ids) and how to sample."""

    prompts: list[str | list[int]]
    params: SamplingParams
    logprobs: int | None
    echo: bool

    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"

    @property
    def sequences(self) -> int:
        """What admission counts: n choices of every prompt."""
        return self.params.n * len(self.prompts)


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
