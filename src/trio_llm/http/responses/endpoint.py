"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API over the
chat path.

A Responses request is a chat request in other clothes: its instructions, the history of its
previous response and its input items become chat messages rendered with the model's chat
template, and its sampling fields and text.format a `SamplingParams` (plan.py); the prepare
step renders them as chat's does (generate/prompt.py: function tools through http/tools, the
calls' grammar added once the template is known, the thinking switch and the
think-then-constrain grammar through http/reasoning, a reader taking the thinking and the calls
back out as reasoning and function_call items); the request skeleton (generate/endpoint.py)
does the rest, disconnects included. What differs is the answer (build.py) and the memory: a
finished response is stored (store.py) unless the request says `store: false`.

The request's path, top to bottom: `plan_responses` (plan.py) -> the skeleton's constraint
check -> `ResponsesEndpoint.prepare` (the previous response's history from the store, the
conversation, then `render_conversation`: tools, thinking, template) -> routing ->
`ResponsesStream` or `complete_response` (build.py), which hand the finished response to the
request's outbox -> `settle`, which stores it (the store may be a Redis server: awaited, and
before the last bytes go out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import trio
from quart import Response

from trio_llm.http.answer import AnswerReader
from trio_llm.http.conversation import Conversation
from trio_llm.http.generate.endpoint import Prompt, serve_generation, serve_render
from trio_llm.http.generate.images import with_images
from trio_llm.http.generate.prompt import OutputFormats, render_conversation
from trio_llm.http.ids import ResponseHead
from trio_llm.http.media import MediaPolicy
from trio_llm.http.reasoning import effort_enables
from trio_llm.http.responses.build import (
    OnFinished,
    ResponsesStream,
    complete_response,
    initial_response,
)
from trio_llm.http.responses.plan import (
    ResponsesPlan,
    conversation_images,
    conversation_messages,
    plan_responses,
)
from trio_llm.http.responses.protocol import (
    DeletedResponse,
    RawMessage,
    ResponseObject,
    ResponsesRequest,
)
from trio_llm.http.responses.store import ResponseStore, StoredResponse
from trio_llm.http.runtime.bodies import json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


@dataclass(frozen=True, slots=True)
class PreparedResponse:
    plan: ResponsesPlan
    prompts: list[Prompt]
    params: SamplingParams
    """The plan's, with the constraint of the whole output: the tools' grammar when they
    constrain the answer (a forced call's wins over text.format), after the thinking when the
    model thinks."""
    new_reader: Callable[[], AnswerReader]
    """Reads the thinking and the function calls out of the answer."""
    outbox: list[StoredResponse] = dataclasses.field(default_factory=list)
    """The finished response to store, from the builder until `settle` stores it."""
    prompt: RawMessage | None = None
    """With enable_response_messages: the rendered prompt, as text and token ids."""


@dataclass(frozen=True, slots=True)
class ResponsesEndpoint:
    """The Responses endpoint's steps (`GenerationEndpoint`), over the server's stored
    responses."""

    store: ResponseStore
    formats: OutputFormats
    """--tool-call-parser and --reasoning-parser."""
    media: MediaPolicy = dataclasses.field(default_factory=MediaPolicy)
    """Where pictures may come from, and how large (--allowed-media-domains, ...)."""
    request_type: ClassVar = ResponsesRequest
    id_prefix: ClassVar = "resp_"

    def plan(
        self, request: ResponsesRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> ResponsesPlan:
        return plan_responses(request, limits, defaults)

    async def prepare(
        self, request: ResponsesRequest, plan: ResponsesPlan, engine: EngineClient, model: ModelInfo
    ) -> PreparedResponse:
        if request.previous_response_id is not None:
            previous = await self.store.get(request.previous_response_id, "previous_response_id")
            plan = dataclasses.replace(plan, history=previous.continued())
        conversation = Conversation(
            conversation_messages(request.instructions, plan.history, plan.items),
            tools=[t.as_tool() for t in plan.tools],
            tool_choice=plan.tool_choice,
            parallel_tool_calls=request.parallel_tool_calls,
            constraint=plan.params.constraint,
            constraint_param=plan.constraint_param,
            thinking=effort_enables(plan.effort),
            effort=plan.effort,
            images=tuple(conversation_images(plan.history, plan.items)),
        )
        rendered = await render_conversation(engine, conversation, self.formats)
        token_ids, images = rendered.token_ids, None
        if conversation.images:
            images = await with_images(engine, token_ids, conversation.images, self.media)
            token_ids = images.token_ids
        prompts = [Prompt(token_ids, "input", images)]
        prompt = None
        if request.enable_response_messages:
            text = await engine.decode(token_ids, skip_special_tokens=False)
            prompt = RawMessage(message=text, tokens=list(token_ids))
        return PreparedResponse(
            plan, prompts, rendered.params(plan.params), rendered.new_reader, prompt=prompt
        )

    def _base(
        self, request: ResponsesRequest, plan: ResponsesPlan, head: ResponseHead
    ) -> ResponseObject:
        return initial_response(
            request, plan, response_id=head.response_id, model=head.model, created=head.created
        )

    def _on_finished(self, request: ResponsesRequest, prepared: PreparedResponse) -> OnFinished:
        """What keeps a finished response: the request's outbox, for `settle` to store, unless
        the request says `store: false`."""
        plan = prepared.plan

        def store(response: ResponseObject) -> None:
            if request.store:
                prepared.outbox.append(StoredResponse(response, plan.history, tuple(plan.items)))

        return store

    async def settle(self, prepared: PreparedResponse) -> None:
        """Store the finished response (the skeleton awaits this before the last bytes)."""
        await trio.lowlevel.checkpoint()
        while prepared.outbox:
            await self.store.put(prepared.outbox.pop())

    def stream(
        self, request: ResponsesRequest, prepared: PreparedResponse, head: ResponseHead
    ) -> ResponsesStream:
        plan = prepared.plan
        return ResponsesStream(
            self._base(request, plan, head),
            self._on_finished(request, prepared),
            plan.top_logprobs,
            prepared.new_reader(),
            prepared.prompt,
        )

    def response(
        self,
        request: ResponsesRequest,
        prepared: PreparedResponse,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> ResponseObject:
        [output] = outputs
        plan = prepared.plan
        return complete_response(
            self._base(request, plan, head),
            output,
            self._on_finished(request, prepared),
            plan.top_logprobs,
            prepared.new_reader(),
            prepared.prompt,
        )


async def create_response(raw: bytes | None = None) -> Response:
    state = current_state()
    endpoint = ResponsesEndpoint(
        state.responses, OutputFormats.of(state.config), state.config.media
    )
    return await serve_generation(endpoint, raw)


async def render_response(raw: bytes | None = None) -> Response:
    """POST /v1/responses/render (vLLM's): the conversation's token ids, not generated; what
    a cache-aware router asks before it routes a Responses request."""
    state = current_state()
    endpoint = ResponsesEndpoint(
        state.responses, OutputFormats.of(state.config), state.config.media
    )
    return await serve_render(endpoint, raw, one=True)


async def retrieve_response(response_id: str) -> Response:
    return json_response(await current_state().responses.retrieve(response_id))


async def delete_response(response_id: str) -> Response:
    await current_state().responses.delete(response_id)
    return json_response(DeletedResponse(response_id))
