"""An /api/chat or /api/generate request validated into a plan: the conversation in the chat
shape http/tools renders (or, for a raw generate, the text itself), the `SamplingParams`, and
what prepare still needs (context tokens, num_ctx, whether thinking was asked for).

Owns what Ollama's own fields mean here: `messages` (roles as given; an assistant's
`tool_calls` with object arguments become OpenAI-shaped calls with ids, and each `tool`
message answers the oldest call not answered yet, or the one its `tool_call_id` names);
`tools` (auto: Ollama has no tool_choice); `format` ("json": any JSON object, an object: a
JSON schema, through the grammar engine); `think` (true/false turns the template's thinking
on or off, "low"/"medium"/"high" turns it on with that effort, for templates that read
`reasoning_effort`); generate's `system`, `raw` and `context` (the token ids a previous
answer returned, put before the new prompt). Refused with a 400 naming the field: images
(this server takes no images yet), a Go `template` (the model's own chat template is used;
`raw` with a prompt formatted by the client does the rest), `suffix` (no fill-in-the-middle),
`system` with `raw` (a raw prompt is sent as written). `logprobs` and `top_logprobs` ask
for the generated tokens' log probabilities. The options are options.py's.
Invariant: nothing here touches Quart or the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trio_llm.constraint import Constraint
from trio_llm.http.conversation import Conversation
from trio_llm.http.errors import ProtocolError, bad_request, not_supported
from trio_llm.http.ollama.options import Sampling, map_options, options_param
from trio_llm.http.ollama.protocol import (
    ChatRequest,
    Format,
    GenerateRequest,
    OllamaMessage,
    OllamaTool,
    Think,
)
from trio_llm.http.sampling import OneSequence, RequestLimits, SamplingDefaults, stop_list
from trio_llm.http.structured import validated
from trio_llm.http.tools import FunctionTool, check_tools
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError


@dataclass(frozen=True, slots=True)
class OllamaPlan(OneSequence):
    """A validated /api/chat or /api/generate request."""

    params: SamplingParams
    conversation: Conversation | None = None
    """None: a raw generate, whose prompt is `raw_prompt`."""
    raw_prompt: str | None = None
    context: tuple[int, ...] = ()
    """Generate's `context`: token ids that come before the new prompt."""
    num_ctx: int | None = None
    thinks: bool = False
    """`think` asked for thinking: a model that cannot think is refused."""
    constraint_param: str | None = None

    @property
    def max_tokens_param(self) -> str:
        return "options.num_predict"


# ---------------------------------------------------------------------------------------------
# Fields both share


def format_constraint(format: Format) -> tuple[Constraint, str] | None:
    if format is None or format == "":
        return None
    if format == "json":
        return Constraint.json_object(), "format"
    return validated(Constraint.json_schema(format), "format")


def thinking(think: Think) -> tuple[bool | None, str | None]:
    """`think` as (the template's switch, the effort)."""
    if think is None or isinstance(think, bool):
        return think, None
    return True, think


def sampling_params(
    sampling: Sampling,
    request: ChatRequest | GenerateRequest,
    constraint: Constraint | None,
    limits: RequestLimits,
    defaults: SamplingDefaults,
) -> SamplingParams:
    """The options' `SamplingParams`, unset fields taking the model's defaults, or a 400
    naming the option."""
    try:
        stops = stop_list(sampling.stop, limits)
    except ProtocolError as error:
        error.param = "options.stop"
        error.message = f"options.stop: {error.message}"
        raise
    params = SamplingParams(
        max_tokens=sampling.max_tokens,
        **defaults.fill(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
        ),
        seed=sampling.seed,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        stop=stops,
        logprobs=_logprobs(request),
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        constraint=constraint,
    )
    try:
        params.validate()
    except SamplingParamsError as error:
        param = options_param(error.param)
        raise bad_request(f"{param}: {error}", param=param) from None
    return params


def _logprobs(request: ChatRequest | GenerateRequest) -> int | None:
    """Alternatives per generated token (None: no logprobs)."""
    if not request.logprobs:
        if request.top_logprobs:
            raise bad_request("top_logprobs: needs logprobs to be true", param="top_logprobs")
        return None
    return request.top_logprobs or 0


# ---------------------------------------------------------------------------------------------
# /api/chat


def _arguments(arguments: dict[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def chat_messages(messages: list[OllamaMessage]) -> list[dict[str, Any]]:
    """The conversation in OpenAI's chat shape (what http/tools and the template read)."""
    out: list[dict[str, Any]] = []
    unanswered: list[str] = []
    """Ids of the latest assistant calls without a tool message yet, oldest first."""
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.images:
            raise not_supported(f"{where}.images", "Image input")
        rendered: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.tool_calls:
            if message.role != "assistant":
                raise bad_request(
                    f"{where}.tool_calls: only an assistant message makes calls",
                    param=f"{where}.tool_calls",
                )
            calls = []
            for j, call in enumerate(message.tool_calls):
                function = call.function
                call_id = call.id or f"call_{i}_{j}"
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": function.name,
                            "arguments": _arguments(function.arguments),
                        },
                    }
                )
            rendered["tool_calls"] = calls
            unanswered = [c["id"] for c in calls]
        elif message.role == "tool":
            call_id = message.tool_call_id
            if call_id is None:
                call_id = unanswered.pop(0) if unanswered else f"call_{i}"
            elif call_id in unanswered:
                unanswered.remove(call_id)
            rendered["tool_call_id"] = call_id
            if message.tool_name:
                rendered["name"] = message.tool_name
        out.append(rendered)
    return out


def _tools(tools: list[OllamaTool] | None) -> list[FunctionTool]:
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.type != "function":
            raise bad_request(
                f"tools[{i}].type: only function tools exist, got {tool.type!r}",
                param=f"tools[{i}].type",
            )
        f = tool.function
        out.append(FunctionTool(f.name, f.description, f.parameters or {"type": "object"}))
    return out


def plan_chat(
    request: ChatRequest, limits: RequestLimits, defaults: SamplingDefaults
) -> OllamaPlan:
    if not request.messages:
        raise bad_request("messages: at least one message is required", param="messages")
    messages = chat_messages(request.messages)
    tools = _tools(request.tools)
    choice = check_tools(tools, None)
    constraint = format_constraint(request.format)
    sampling = map_options(request.options)
    params = sampling_params(
        sampling, request, None if constraint is None else constraint[0], limits, defaults
    )
    enabled, effort = thinking(request.think)
    continues = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
    conversation = Conversation(
        messages,
        tools=tools,
        tool_choice=choice,
        constraint=params.constraint,
        constraint_param=None if constraint is None else constraint[1],
        thinking=enabled,
        effort=effort,
        budget_param="think",
        add_generation_prompt=not continues,
        continue_final_message=continues,
    )
    return OllamaPlan(
        params,
        conversation,
        num_ctx=sampling.num_ctx,
        thinks=bool(enabled),
        constraint_param=conversation.constraint_param,
    )


# ---------------------------------------------------------------------------------------------
# /api/generate


def _refuse_generate_fields(request: GenerateRequest) -> None:
    if request.images:
        raise not_supported("images", "Image input")
    if request.template:
        raise not_supported(
            "template",
            "A Go template (the model's own chat template is used; send raw: true with a "
            "prompt you formatted to use your own)",
        )
    if request.suffix:
        raise not_supported("suffix", "Fill-in-the-middle (a suffix)")
    if request.raw and request.system:
        raise bad_request(
            "system: a raw prompt is sent as written; put the system text in the prompt",
            param="system",
        )


def plan_generate(
    request: GenerateRequest, limits: RequestLimits, defaults: SamplingDefaults
) -> OllamaPlan:
    _refuse_generate_fields(request)
    if not request.prompt:
        raise bad_request("prompt: must not be empty", param="prompt")
    constraint = format_constraint(request.format)
    sampling = map_options(request.options)
    params = sampling_params(
        sampling, request, None if constraint is None else constraint[0], limits, defaults
    )
    context = tuple(request.context or ())
    constraint_param = None if constraint is None else constraint[1]
    if request.raw:
        if request.think:
            raise bad_request(
                "think: a raw prompt is sent as written, with no template to turn thinking on",
                param="think",
            )
        return OllamaPlan(
            params,
            raw_prompt=request.prompt,
            context=context,
            num_ctx=sampling.num_ctx,
            constraint_param=constraint_param,
        )
    messages = [{"role": "user", "content": request.prompt}]
    if request.system:
        messages.insert(0, {"role": "system", "content": request.system})
    enabled, effort = thinking(request.think)
    conversation = Conversation(
        messages,
        constraint=params.constraint,
        constraint_param=constraint_param,
        thinking=enabled,
        effort=effort,
        budget_param="think",
    )
    return OllamaPlan(
        params,
        conversation,
        context=context,
        num_ctx=sampling.num_ctx,
        thinks=bool(enabled),
        constraint_param=constraint_param,
    )
