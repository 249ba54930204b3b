"""POST /v1/chat/completions: one conversation, rendered with the model's chat template, and n
choices of an assistant's answer (streamed as chat.completion.chunk, or one chat.completion).
The prompts step renders it (generate/prompt.py): with tools, http/tools renders the
conversation for the template and adds the grammar that makes the calls well-formed; with a
thinking model, http/reasoning sets the template's switch, and the answer's constraint waits
for the thinking to end. Each choice's thinking and calls are read back into
reasoning_content and tool_calls."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import msgspec
from quart import Response

from trio_llm.http.answer import AnswerReader
from trio_llm.http.chat.build import ChatStream, NewReader, chat_response
from trio_llm.http.chat.plan import ChatPlan, plan_chat
from trio_llm.http.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from trio_llm.http.generate.endpoint import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    serve_generation,
)
from trio_llm.http.generate.prompt import render_conversation
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
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
        self._prompt_token_ids: list[int] = []
        self._new_reader: NewReader = AnswerReader
        self._reasoning = False
        """Whether the thinking is split out and sent."""

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        plan = self.plan
        config = current_state().config
        rendered = await render_conversation(engine, plan.conversation, config)
        if rendered.constraint != plan.params.constraint:
            params = msgspec.structs.replace(plan.params, constraint=rendered.constraint)
            self.plan = plan = dataclasses.replace(plan, params=params)
        self._new_reader = rendered.new_reader
        self._reasoning = rendered.reasoning.format is not None and plan.include_reasoning
        token_ids = rendered.token_ids
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
            new_reader=self._new_reader,
            reasoning=self._reasoning,
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> ChatCompletionResponse:
        [output] = outputs
        return chat_response(
            self.shape(head, logprobs=self.plan.top_logprobs),
            output,
            echo_text=self.plan.echo_text,
            new_reader=self._new_reader,
            reasoning=self._reasoning,
        )


async def chat_completions() -> Response:
    return await serve_generation(ChatCompletion)
