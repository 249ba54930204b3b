"""POST /v1/chat/completions: one conversation, rendered with the model's chat template, and n
choices of an assistant's answer (streamed as chat.completion.chunk, or one chat.completion).
With tools, http/tools renders the conversation for the template, adds the grammar that makes
the calls well-formed (known only once the model's template is: the prepare step), and reads
each choice's calls back into tool_calls.

The request's path, top to bottom: `plan_chat` (plan.py) -> the skeleton's constraint check and
routing (generate/endpoint.py) -> `ChatCompletion.prepare` (tools, template, truncation) ->
`ChatStream` or `chat_response` (build.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import msgspec
from quart import Response

from trio_llm.http.chat.build import ChatStream, NewParser, chat_response
from trio_llm.http.chat.plan import ChatPlan, plan_chat
from trio_llm.http.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from trio_llm.http.choices import Shape
from trio_llm.http.conversation import check_template_kwargs
from trio_llm.http.generate.endpoint import Prompt, check_constraint, serve_generation, serve_render
from trio_llm.http.ids import ResponseHead
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.http.tools import plan_tools
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


@dataclass(frozen=True, slots=True)
class PreparedChat:
    plan: ChatPlan
    prompts: list[Prompt]
    params: SamplingParams
    """The plan's, with the tools' grammar when they constrain the answer."""
    new_parser: NewParser | None
    """With tools: reads each choice's calls."""

    def shape(self, request: ChatCompletionRequest, head: ResponseHead) -> Shape:
        return Shape.of(head, request, logprobs=self.plan.top_logprobs)


@dataclass(frozen=True, slots=True)
class ChatCompletion:
    """The chat endpoint's steps (`GenerationEndpoint`)."""

    tool_call_parser: str
    """--tool-call-parser: the format tool calls are prompted, constrained and read in."""
    request_type: ClassVar = ChatCompletionRequest
    id_prefix: ClassVar = "chatcmpl-"

    def plan(
        self, request: ChatCompletionRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> ChatPlan:
        plan = plan_chat(request, limits, defaults)
        check_template_kwargs(request.chat_template_kwargs)
        return plan

    async def prepare(
        self, request: ChatCompletionRequest, plan: ChatPlan, engine: EngineClient, model: ModelInfo
    ) -> PreparedChat:
        messages, template_kwargs = plan.messages, request.chat_template_kwargs
        params, new_parser = plan.params, None
        if plan.with_tools:
            tools = plan_tools(
                plan.tools,
                plan.tool_choice,
                plan.parallel_tool_calls,
                plan.messages,
                chat_template=engine.chat_template,
                parser=self.tool_call_parser,
                constrain=plan.params.constraint is None,
            )
            messages = tools.messages
            template_kwargs = {**(template_kwargs or {}), **tools.template_kwargs}
            new_parser = tools.new_parser
            if tools.constraint is not None:
                await check_constraint(tools.constraint, "tools")
                params = msgspec.structs.replace(params, constraint=tools.constraint)
        token_ids = await engine.apply_chat_template(
            messages,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template_kwargs=template_kwargs,
            add_special_tokens=request.add_special_tokens,
        )
        if plan.truncation is not None:
            token_ids = plan.truncation.apply(token_ids, model.max_model_len, params.max_tokens)
        return PreparedChat(plan, [Prompt(token_ids, "messages")], params, new_parser)

    def stream(
        self, request: ChatCompletionRequest, prepared: PreparedChat, head: ResponseHead
    ) -> ChatStream:
        return ChatStream(
            prepared.shape(request, head),
            prompt_token_ids=prepared.prompts[0].token_ids,
            echo_text=prepared.plan.echo_text,
            new_parser=prepared.new_parser,
        )

    def response(
        self,
        request: ChatCompletionRequest,
        prepared: PreparedChat,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> ChatCompletionResponse:
        [output] = outputs
        return chat_response(
            prepared.shape(request, head),
            output,
            echo_text=prepared.plan.echo_text,
            new_parser=prepared.new_parser,
        )


async def chat_completions(raw: bytes | None = None) -> Response:
    """`raw`: the body, when the caller has read it already (/invocations)."""
    parser = current_state().config.tool_call_parser
    return await serve_generation(ChatCompletion(parser), raw)


async def render_chat_completion() -> Response:
    """POST /v1/chat/completions/render: the conversation's token ids, not generated."""
    parser = current_state().config.tool_call_parser
    return await serve_render(ChatCompletion(parser), one=True)
