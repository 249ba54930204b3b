"""A chat completion request validated into a plan: the conversation to render, the tools,
and the `SamplingParams`.

Owns what chat's own fields mean (max_completion_tokens over max_tokens, logprobs and
top_logprobs, vLLM's echo and continue_final_message, the tools and tool_choice, checked by
http/tools, reasoning_effort and vLLM's thinking_token_budget for http/reasoning); the
conversation's checks are http/conversation.py's, the sampling fields' http/sampling.py's.
Invariant: every way a request can be wrong ends in a `ProtocolError` naming the parameter,
and nothing here touches Quart or the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from trio_llm.http.chat.protocol import ChatCompletionRequest, NamedToolChoice
from trio_llm.http.conversation import (
    Conversation,
    ImageRef,
    chat_messages,
    check_template_kwargs,
)
from trio_llm.http.errors import bad_request
from trio_llm.http.reasoning import effort_enables
from trio_llm.http.sampling import (
    OPENAI_DEFAULTS,
    RequestLimits,
    SamplingDefaults,
    Truncation,
    sampling_params,
    truncation,
)
from trio_llm.http.tools import FunctionTool, NamedFunction, ToolChoiceValue, check_tools
from trio_llm.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class ChatPlan:
    """A validated chat request: the conversation to render and how to sample the answer."""

    conversation: Conversation
    """The messages, tools and thinking switches to render."""
    params: SamplingParams
    max_tokens_param: str
    top_logprobs: int | None
    """None: no logprobs in the response."""
    prompt_logprobs: int | None = None
    """vLLM's prompt_logprobs field; None: not returned."""
    echo_text: str | None = None
    """vLLM's chat echo: the last message's content, when it is the assistant's."""
    truncation: Truncation | None = None
    include_reasoning: bool = True
    """vLLM's include_reasoning: false leaves the thinking out of the response."""

    @property
    def sequences(self) -> int:
        """What admission counts: one sequence per choice."""
        return self.params.n

    @property
    def constraint_param(self) -> str | None:
        """The field the structured-output constraint came from (`response_format`, ...)."""
        return self.conversation.constraint_param


def _tools(
    request: ChatCompletionRequest, constrained: bool
) -> tuple[list[FunctionTool], ToolChoiceValue]:
    """The tools and the choice in force; `constrained`: the request asks for a
    structured-output constraint, which a forced call cannot be combined with."""
    tools = [
        FunctionTool(t.function.name, t.function.description, t.function.parameters)
        for t in request.tools or ()
    ]
    given = request.tool_choice
    choice = NamedFunction(given.function.name) if isinstance(given, NamedToolChoice) else given
    choice = check_tools(tools, choice)
    forced = choice not in ("none", "auto")
    if forced and constrained:
        raise bad_request(
            "tool_choice: a forced call cannot be combined with a structured-output constraint "
            "(response_format, structured_outputs, guided_*)",
            param="tool_choice",
        )
    return tools, choice


def plan_chat(
    request: ChatCompletionRequest,
    limits: RequestLimits,
    defaults: SamplingDefaults = OPENAI_DEFAULTS,
) -> ChatPlan:
    if request.top_logprobs is not None and not request.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", param="top_logprobs")
    if request.continue_final_message and request.add_generation_prompt:
        raise bad_request(
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
        )
    check_template_kwargs(request.chat_template_kwargs)
    images: list[ImageRef] = []
    messages = chat_messages(request.messages, images=images)
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
    params, constraint_param = sampling_params(
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
    tools, tool_choice = _tools(request, params.constraint is not None)
    conversation = Conversation(
        messages,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=request.parallel_tool_calls,
        constraint=params.constraint,
        constraint_param=constraint_param,
        template_kwargs=request.chat_template_kwargs,
        thinking=effort_enables(request.reasoning_effort),
        effort=request.reasoning_effort,
        budget=request.thinking_token_budget,
        add_generation_prompt=request.add_generation_prompt,
        continue_final_message=request.continue_final_message,
        add_special_tokens=request.add_special_tokens,
        images=tuple(images),
    )
    return ChatPlan(
        conversation,
        params,
        max_tokens_param,
        top_logprobs,
        prompt_logprobs=request.prompt_logprobs,
        echo_text=echo_text,
        truncation=truncation(request),
        include_reasoning=request.include_reasoning,
    )
