"""POST /v1/chat/completions: one conversation, rendered with the model's chat template, and n
choices of an assistant's answer (streamed as chat.completion.chunk, or one chat.completion).
With tools, http/tools renders the conversation for the template, adds the grammar that makes
the calls well-formed (known only once the model's template is: the prompts step), and reads
each choice's calls back into tool_calls."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import msgspec
from quart import Response

from trio_llm.http.chat.build import ChatStream, NewParser, chat_response
from trio_llm.http.chat.plan import ChatPlan, plan_chat
from trio_llm.http.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from trio_llm.http.conversation import check_template_kwargs
from trio_llm.http.generate.endpoint import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    check_constraint,
    serve_generation,
)
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.http.tools import plan_tools
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


class ChatCompletion(GenerationEndpoint[ChatCompletionRequest]):
    request_type = ChatCompletionRequest
    id_prefix = "chatcmpl-"
    plan: ChatPlan

    def __init__(
        self, request: ChatCompletionRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> None:
        super().__init__(request, limits, defaults)
        self.plan = plan_chat(request, limits, defaults)
        check_template_kwargs(request.chat_template_kwargs)
        self._prompt_token_ids: list[int] = []
        self._new_parser: NewParser | None = None
        """Set with tools: reads each choice's calls."""

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        req, plan = self.request, self.plan
        messages, template_kwargs = plan.messages, req.chat_template_kwargs
        if plan.with_tools:
            tools = plan_tools(
                plan.tools,
                plan.tool_choice,
                plan.parallel_tool_calls,
                plan.messages,
                chat_template=engine.chat_template,
                parser=current_state().config.tool_call_parser,
                constrain=plan.params.constraint is None,
            )
            messages = tools.messages
            template_kwargs = {**(template_kwargs or {}), **tools.template_kwargs}
            self._new_parser = tools.new_parser
            if tools.constraint is not None:
                await check_constraint(tools.constraint, "tools")
                params = msgspec.structs.replace(plan.params, constraint=tools.constraint)
                self.plan = plan = dataclasses.replace(plan, params=params)
        token_ids = await engine.apply_chat_template(
            messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=template_kwargs,
            add_special_tokens=req.add_special_tokens,
        )
        if plan.truncation is not None:
            token_ids = plan.truncation.apply(
                token_ids, model.max_model_len, plan.params.max_tokens
            )
        self._prompt_token_ids = token_ids
        return [Prompt(token_ids, "messages")]

    def stream(self, head: ResponseHead) -> ChatStream:
        return ChatStream(
            self.shape(head, logprobs=self.plan.top_logprobs),
            prompt_token_ids=self._prompt_token_ids,
            echo_text=self.plan.echo_text,
            new_parser=self._new_parser,
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> ChatCompletionResponse:
        [output] = outputs
        return chat_response(
            self.shape(head, logprobs=self.plan.top_logprobs),
            output,
            echo_text=self.plan.echo_text,
            new_parser=self._new_parser,
        )


async def chat_completions() -> Response:
    return await serve_generation(ChatCompletion)
