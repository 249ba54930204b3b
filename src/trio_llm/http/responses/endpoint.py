"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API over the
chat path.

A Responses request is a chat request in other clothes: its instructions, the history of its
previous response and its input items become chat messages rendered with the model's chat
template, and its sampling fields and text.format a `SamplingParams` (plan.py); its function
tools go through http/tools as chat's do (rendered for the template, the calls' grammar added
once the template is known: the prepare step, a parser reading the calls back into
function_call items); the request skeleton (generate/endpoint.py) does the rest, disconnects
included. What differs is the answer (build.py) and the memory: a finished response is stored
(store.py) unless the request says `store: false`.

The request's path, top to bottom: `plan_responses` (plan.py) -> the skeleton's constraint
check -> `ResponsesEndpoint.prepare` (the previous response's history from the store,
conversation, tools, template) -> routing -> `ResponsesStream` or `complete_response`
(build.py), which hand the finished response to the request's outbox -> `settle`, which
stores it (the store may be a Redis server: awaited, and before the last bytes go out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import msgspec
import trio
from quart import Response

from trio_llm.http.generate.endpoint import Prompt, check_constraint, serve_generation
from trio_llm.http.ids import ResponseHead
from trio_llm.http.responses.build import (
    OnFinished,
    ResponsesStream,
    complete_response,
    initial_response,
)
from trio_llm.http.responses.plan import ResponsesPlan, conversation_messages, plan_responses
from trio_llm.http.responses.protocol import DeletedResponse, ResponseObject, ResponsesRequest
from trio_llm.http.responses.store import ResponseStore, StoredResponse
from trio_llm.http.runtime.bodies import json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.http.tools import NamedFunction, ToolPlan, plan_tools
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


@dataclass(frozen=True, slots=True)
class PreparedResponse:
    plan: ResponsesPlan
    prompts: list[Prompt]
    params: SamplingParams
    """The plan's, with the tools' grammar when they constrain the answer (a forced call's
    wins over text.format)."""
    tools: ToolPlan
    """Its `new_parser` reads the function calls out of the answer."""
    outbox: list[StoredResponse] = dataclasses.field(default_factory=list)
    """The finished response to store, from the builder until `settle` stores it."""


@dataclass(frozen=True, slots=True)
class ResponsesEndpoint:
    """The Responses endpoint's steps (`GenerationEndpoint`), over the server's stored
    responses."""

    store: ResponseStore
    tool_call_parser: str
    """--tool-call-parser: the format tool calls are prompted, constrained and read in."""
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
        messages = conversation_messages(request.instructions, plan.history, plan.items)
        choice = plan.tool_choice
        forced = choice == "required" or isinstance(choice, NamedFunction)
        tools = plan_tools(
            [t.as_tool() for t in plan.tools],
            choice,
            request.parallel_tool_calls,
            messages,
            chat_template=engine.chat_template,
            parser=self.tool_call_parser,
            constrain=forced or plan.params.constraint is None,
        )
        params = plan.params
        if tools.constraint is not None:  # the calls' grammar (a forced one wins text.format)
            await check_constraint(tools.constraint, "tools")
            params = msgspec.structs.replace(params, constraint=tools.constraint)
        token_ids = await engine.apply_chat_template(
            tools.messages, chat_template_kwargs=tools.template_kwargs or None
        )
        return PreparedResponse(plan, [Prompt(token_ids, "input")], params, tools)

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
                prepared.outbox.append(StoredResponse(response, (*plan.history, *plan.items)))

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
            prepared.tools.new_parser(),
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
            prepared.tools.new_parser(),
        )


async def create_response(raw: bytes | None = None) -> Response:
    state = current_state()
    endpoint = ResponsesEndpoint(state.responses, state.config.tool_call_parser)
    return await serve_generation(endpoint, raw)


async def retrieve_response(response_id: str) -> Response:
    stored = await current_state().responses.get(response_id)
    return json_response(stored.response)


async def delete_response(response_id: str) -> Response:
    await current_state().responses.delete(response_id)
    return json_response(DeletedResponse(response_id))
