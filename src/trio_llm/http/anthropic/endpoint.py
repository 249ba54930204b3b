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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from quart import Response

from trio_llm.constraint import Constraint
from trio_llm.http.answer import AnswerReader
from trio_llm.http.anthropic.build import MessagesStream, message_response
from trio_llm.http.anthropic.plan import (
    ConversationPlan,
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
from trio_llm.http.reasoning import (
    PROMPT_TAIL_TOKENS,
    ReasoningPlan,
    pick_reasoning_format,
    plan_reasoning,
    thinking_kwargs,
)
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.http.tools import ToolPlan, plan_tools
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient
    from trio_llm.http.config import ServerConfig


@dataclass(frozen=True, slots=True)
class Rendered:
    """A conversation rendered for the model: its prompt, the constraint of the whole output
    (the answer's, after the thinking), and what reads the output back."""

    token_ids: list[int]
    constraint: Constraint | None
    constraint_param: str | None
    tools: ToolPlan | None
    reasoning: ReasoningPlan

    def new_reader(self) -> AnswerReader:
        tools = None if self.tools is None else self.tools.new_parser()
        return AnswerReader(self.reasoning.new_parser(), tools)


async def render(engine: EngineClient, plan: ConversationPlan, config: ServerConfig) -> Rendered:
    template = engine.chat_template
    messages = plan.messages
    kwargs: dict[str, Any] = thinking_kwargs(template, enabled=plan.thinking, effort=plan.effort)
    constraint, param = plan.constraint, plan.constraint_param
    tools = None
    if plan.with_tools:
        tools = plan_tools(
            plan.tools,
            plan.tool_choice,
            plan.parallel_tool_calls,
            messages,
            chat_template=template,
            parser=config.tool_call_parser,
            constrain=constraint is None,
        )
        messages = tools.messages
        kwargs.update(tools.template_kwargs)
        if tools.constraint is not None:
            constraint, param = tools.constraint, "tools"
    token_ids = await engine.apply_chat_template(
        messages,
        add_generation_prompt=not plan.continue_final,
        continue_final_message=plan.continue_final,
        chat_template_kwargs=kwargs or None,
    )
    reasoning = ReasoningPlan(None)
    format = pick_reasoning_format(config.reasoning_parser, template)
    if format is not None:
        tail = await engine.decode(token_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        reasoning = plan_reasoning(format, tail, plan.budget)
        if constraint is None and reasoning.budget is not None:
            param = "thinking.budget_tokens"
        constraint = reasoning.constrain(constraint)
    return Rendered(token_ids, constraint, param, tools, reasoning)


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
        rendered = await render(engine, self.plan.conversation, current_state().config)
        if rendered.constraint != self.plan.params.constraint:
            await check_constraint(rendered.constraint, rendered.constraint_param)
            params = msgspec.structs.replace(self.plan.params, constraint=rendered.constraint)
            self.plan = dataclasses.replace(self.plan, params=params)
        self._new_reader = rendered.new_reader
        self._prompt_tokens = len(rendered.token_ids)
        return [Prompt(rendered.token_ids, "messages")]

    def stream(self, head: ResponseHead) -> MessagesStream:
        return MessagesStream(head.response_id, head.model, self._prompt_tokens, self._new_reader())

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> Message:
        [output] = outputs
        return message_response(head.response_id, head.model, output, self._new_reader())


async def create_message() -> Response:
    return await serve_generation(MessagesEndpoint)


async def count_tokens() -> Response:
    request = await decode_body(CountTokensRequest)
    state = current_state()
    engine, _ = state.engine_for(request.model)
    rendered = await render(engine, plan_conversation(request), state.config)
    return json_response(TokenCount(len(rendered.token_ids)))
