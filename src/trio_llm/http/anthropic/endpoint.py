"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

A Messages request is a chat request in other clothes: its system text and message blocks
become chat messages rendered with the model's chat template (plan.py), its tools go through
http/tools as chat's do (rendered for the template, the calls' grammar added once the template
is known, a parser reading them back as `tool_use` blocks), its thinking through
http/reasoning (the template's switch, a budget, `thinking` blocks), and the request
skeleton (generate/endpoint.py) does the rest, disconnects included. count_tokens renders the
same prompt, tools and thinking switch included, and counts it. Errors on these paths take
Anthropic's shape (app.py asks `error_body`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec
from quart import Response

from trio_llm.http.answer import AnswerReader
from trio_llm.http.anthropic.build import MessagesStream, message_response
from trio_llm.http.anthropic.plan import (
    MessagesPlan,
    plan_conversation,
    plan_messages,
)
from trio_llm.http.anthropic.protocol import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    TokenCount,
)
from trio_llm.http.generate.endpoint import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    check_constraint,
    serve_generation,
)
from trio_llm.http.generate.prompt import render_conversation
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


class MessagesEndpoint(GenerationEndpoint[MessagesRequest]):
    request_type = MessagesRequest
    id_prefix = "msg_"
    plan: MessagesPlan

    def __init__(
        self, request: MessagesRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> None:
        super().__init__(request, limits, defaults)
        self.plan = plan_messages(request, limits, defaults)
        self._new_reader: Callable[[], AnswerReader] = AnswerReader
        self._prompt_tokens = 0

    async def check(self) -> None:
        conversation = self.plan.conversation
        await check_constraint(conversation.constraint, conversation.constraint_param)

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        config = current_state().config
        rendered = await render_conversation(engine, self.plan.conversation, config)
        if rendered.constraint != self.plan.params.constraint:
            params = msgspec.structs.replace(self.plan.params, constraint=rendered.constraint)
            self.plan = dataclasses.replace(self.plan, params=params)
        self._new_reader = rendered.new_reader
        self._prompt_tokens = len(rendered.token_ids)
        return [Prompt(rendered.token_ids, "messages")]

    def stream(self, head: ResponseHead) -> MessagesStream:
        return MessagesStream(
            head.response_id,
            head.model,
            self._prompt_tokens,
            self._new_reader(),
            show_thinking=self.plan.show_thinking,
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> Message:
        [output] = outputs
        return message_response(
            head.response_id,
            head.model,
            output,
            self._new_reader(),
            show_thinking=self.plan.show_thinking,
        )


async def create_message() -> Response:
    return await serve_generation(MessagesEndpoint)


async def count_tokens() -> Response:
    request = await decode_body(CountTokensRequest)
    state = current_state()
    lease, _ = state.lease(request.model)
    rendered = await render_conversation(lease.client, plan_conversation(request), state.config)
    return json_response(TokenCount(len(rendered.token_ids)))
