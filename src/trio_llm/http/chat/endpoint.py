"""POST /v1/chat/completions: one conversation, rendered with the model's chat template, and n
choices of an assistant's answer (streamed as chat.completion.chunk, or one chat.completion).
The prepare step renders it (generate/prompt.py): with tools, http/tools renders the
conversation for the template and adds the grammar that makes the calls well-formed (known only
once the model's template is); with a thinking model, http/reasoning sets the template's
switch, and the answer's constraint waits for the thinking to end. Each choice's thinking and
calls are read back into reasoning_content and tool_calls.

The request's path, top to bottom: `plan_chat` (plan.py) -> the skeleton's constraint check and
routing (generate/endpoint.py) -> `ChatCompletion.prepare` (`render_conversation`: tools,
thinking, template; then truncation) -> `ChatStream` or `chat_response` (build.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from quart import Response

from trio_llm.http.chat.build import ChatStream, NewReader, chat_response
from trio_llm.http.chat.plan import ChatPlan, plan_chat
from trio_llm.http.chat.protocol import ChatCompletionRequest, ChatCompletionResponse
from trio_llm.http.choices import Shape
from trio_llm.http.generate.endpoint import Prompt, serve_generation, serve_render
from trio_llm.http.generate.images import with_images
from trio_llm.http.generate.prompt import OutputFormats, render_conversation
from trio_llm.http.ids import ResponseHead
from trio_llm.http.media import MediaPolicy
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


@dataclass(frozen=True, slots=True)
class PreparedChat:
    plan: ChatPlan
    prompts: list[Prompt]
    params: SamplingParams
    """The plan's, with the constraint of the whole output: the tools' grammar when they
    constrain the answer, after the thinking when the model thinks."""
    new_reader: NewReader
    """Reads each choice's thinking, answer and calls."""
    reasoning: bool
    """Whether the thinking is split out and sent."""

    def shape(self, request: ChatCompletionRequest, head: ResponseHead) -> Shape:
        return Shape.of(head, request, logprobs=self.plan.top_logprobs)


@dataclass(frozen=True, slots=True)
class ChatCompletion:
    """The chat endpoint's steps (`GenerationEndpoint`)."""

    formats: OutputFormats
    """--tool-call-parser and --reasoning-parser."""
    media: MediaPolicy = field(default_factory=MediaPolicy)
    """Where pictures may come from, and how large (--allowed-media-domains, ...)."""
    request_type: ClassVar = ChatCompletionRequest
    id_prefix: ClassVar = "chatcmpl-"

    def plan(
        self, request: ChatCompletionRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> ChatPlan:
        return plan_chat(request, limits, defaults)

    async def prepare(
        self, request: ChatCompletionRequest, plan: ChatPlan, engine: EngineClient, model: ModelInfo
    ) -> PreparedChat:
        rendered = await render_conversation(engine, plan.conversation, self.formats)
        params = rendered.params(plan.params)
        token_ids = rendered.token_ids
        if plan.truncation is not None:
            token_ids = plan.truncation.apply(token_ids, model.max_model_len, params.max_tokens)
        reasoning = rendered.reasoning.format is not None and plan.include_reasoning
        images = None
        if plan.conversation.images:
            images = await with_images(engine, token_ids, plan.conversation.images, self.media)
            token_ids = images.token_ids
        prompts = [Prompt(token_ids, "messages", images)]
        return PreparedChat(plan, prompts, params, rendered.new_reader, reasoning)

    def stream(
        self, request: ChatCompletionRequest, prepared: PreparedChat, head: ResponseHead
    ) -> ChatStream:
        return ChatStream(
            prepared.shape(request, head),
            prompt_token_ids=prepared.prompts[0].token_ids,
            echo_text=prepared.plan.echo_text,
            new_reader=prepared.new_reader,
            reasoning=prepared.reasoning,
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
            new_reader=prepared.new_reader,
            reasoning=prepared.reasoning,
        )


async def chat_completions(raw: bytes | None = None) -> Response:
    """`raw`: the body, when the caller has read it already (/invocations)."""
    config = current_state().config
    return await serve_generation(ChatCompletion(OutputFormats.of(config), config.media), raw)


async def render_chat_completion() -> Response:
    """POST /v1/chat/completions/render: the conversation's token ids, not generated."""
    config = current_state().config
    return await serve_render(ChatCompletion(OutputFormats.of(config), config.media), one=True)
