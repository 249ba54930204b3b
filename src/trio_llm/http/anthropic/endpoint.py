"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

A Messages request is a chat request in other clothes: its system text and message blocks
become chat messages rendered with the model's chat template (plan.py), its tools go through
http/tools as chat's do (rendered for the template, the calls' grammar added once the template
is known, a parser reading them back as `tool_use` blocks), its thinking through
http/reasoning (the template's switch, a budget, `thinking` blocks), and the request
skeleton (generate/endpoint.py) does the rest, disconnects included. count_tokens renders the
same prompt, tools and thinking switch included, and counts it. Errors on these paths take
Anthropic's shape (app.py asks `error_body`).

The request's path, top to bottom: `plan_messages` (plan.py) -> the skeleton's constraint check
and routing (generate/endpoint.py) -> `MessagesEndpoint.prepare` (`render_conversation`: tools,
thinking, template) -> `MessagesStream` or `message_response` (build.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

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
from trio_llm.http.anthropic.signing import thinking_key
from trio_llm.http.generate.endpoint import Prompt, serve_generation
from trio_llm.http.generate.images import with_images
from trio_llm.http.generate.prompt import OutputFormats, render_conversation
from trio_llm.http.ids import ResponseHead
from trio_llm.http.media import MediaPolicy
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


@dataclass(frozen=True, slots=True)
class PreparedMessage:
    plan: MessagesPlan
    prompts: list[Prompt]
    params: SamplingParams
    """The plan's, with the constraint of the whole output (the calls', or the answer's after
    the thinking)."""
    new_reader: Callable[[], AnswerReader]
    """Reads the thinking and the tool calls out of the answer."""

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompts[0].token_ids)


@dataclass(frozen=True, slots=True)
class MessagesEndpoint:
    """The Messages endpoint's steps (`GenerationEndpoint`)."""

    formats: OutputFormats
    """--tool-call-parser and --reasoning-parser."""
    key: bytes
    """What thinking blocks are signed and verified with (signing.py)."""
    media: MediaPolicy = field(default_factory=MediaPolicy)
    """Where pictures may come from, and how large (--allowed-media-domains, ...)."""
    request_type: ClassVar = MessagesRequest
    id_prefix: ClassVar = "msg_"

    def plan(
        self, request: MessagesRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> MessagesPlan:
        return plan_messages(request, limits, defaults, self.key)

    async def prepare(
        self, request: MessagesRequest, plan: MessagesPlan, engine: EngineClient, model: ModelInfo
    ) -> PreparedMessage:
        rendered = await render_conversation(engine, plan.conversation, self.formats)
        token_ids, images = rendered.token_ids, None
        if plan.conversation.images:
            images = await with_images(engine, token_ids, plan.conversation.images, self.media)
            token_ids = images.token_ids
        prompts = [Prompt(token_ids, "messages", images)]
        return PreparedMessage(plan, prompts, rendered.params(plan.params), rendered.new_reader)

    def stream(
        self, request: MessagesRequest, prepared: PreparedMessage, head: ResponseHead
    ) -> MessagesStream:
        return MessagesStream(
            head.response_id,
            head.model,
            prepared.prompt_tokens,
            prepared.new_reader(),
            show_thinking=prepared.plan.show_thinking,
            key=self.key,
        )

    def response(
        self,
        request: MessagesRequest,
        prepared: PreparedMessage,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> Message:
        [output] = outputs
        return message_response(
            head.response_id,
            head.model,
            output,
            prepared.new_reader(),
            show_thinking=prepared.plan.show_thinking,
            key=self.key,
        )


async def create_message() -> Response:
    config = current_state().config
    key = thinking_key(config.thinking_secret)
    return await serve_generation(MessagesEndpoint(OutputFormats.of(config), key, config.media))


async def count_tokens() -> Response:
    request = await decode_body(CountTokensRequest)
    state = current_state()
    lease, _ = state.lease(request.model)
    formats = OutputFormats.of(state.config)
    conversation = plan_conversation(request, thinking_key(state.config.thinking_secret))
    rendered = await render_conversation(lease.client, conversation, formats)
    token_ids = rendered.token_ids
    if conversation.images:  # each picture counts its placeholders
        media = state.config.media
        token_ids = (
            await with_images(lease.client, token_ids, conversation.images, media)
        ).token_ids
    return json_response(TokenCount(len(token_ids)))
