"""POST /v1/chat/completions: one conversation, rendered with the model's chat template, and n
choices of an assistant's answer (streamed as chat.completion.chunk, or one chat.completion)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response

from trio_llm.http.builders import ChatStream, chat_response
from trio_llm.http.plans import ChatPlan, RequestLimits, check_template_kwargs, plan_chat
from trio_llm.http.protocol import ChatCompletionRequest
from trio_llm.http.responses import ChatCompletionResponse
from trio_llm.http.serving import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    serve_generation,
)
from trio_llm.http.state import ModelInfo
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


class ChatCompletion(GenerationEndpoint[ChatCompletionRequest]):
    request_type = ChatCompletionRequest
    id_prefix = "chatcmpl"
    plan: ChatPlan

    def __init__(self, request: ChatCompletionRequest, limits: RequestLimits) -> None:
        super().__init__(request, limits)
        self.plan = plan_chat(request, limits)
        check_template_kwargs(request.chat_template_kwargs)

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        req = self.request
        token_ids = await engine.apply_chat_template(
            self.plan.messages,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        return [Prompt(token_ids, "messages")]

    def stream(self, head: ResponseHead) -> ChatStream:
        return ChatStream(
            response_id=head.response_id,
            model=head.model,
            created=head.created,
            n=self.plan.params.n,
            top_logprobs=self.plan.top_logprobs,
            include_usage=self.request.include_usage,
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> ChatCompletionResponse:
        [output] = outputs
        return chat_response(
            response_id=head.response_id,
            model=head.model,
            created=head.created,
            output=output,
            top_logprobs=self.plan.top_logprobs,
        )


async def chat_completions() -> Response:
    return await serve_generation(ChatCompletion)
