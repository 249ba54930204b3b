"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API over the
chat path.

A Responses request is a chat request in other clothes: its instructions, the history of its
previous response and its input items become chat messages rendered with the model's chat
template, and its sampling fields and text.format a `SamplingParams` (plan.py); its
function tools go through http/tools as chat's do (rendered for the template, the calls'
grammar added once the template is known: the prompts step, a parser reading the calls back
into function_call items); the request skeleton (generate/endpoint.py) does the rest, disconnects
included. What differs is the answer
(build.py) and the memory: a finished response is stored (store.py) unless
the request says `store: false`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import msgspec
from quart import Response

from trio_llm.http.generate.endpoint import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    check_constraint,
    serve_generation,
)
from trio_llm.http.responses.build import ResponsesStream, complete_response, initial_response
from trio_llm.http.responses.plan import ResponsesPlan, conversation_messages, plan_responses
from trio_llm.http.responses.protocol import (
    DeletedResponse,
    InputItem,
    ResponseObject,
    ResponsesRequest,
)
from trio_llm.http.responses.store import StoredResponse
from trio_llm.http.runtime.bodies import json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.http.tools import NamedFunction, ToolCallParser, plan_tools
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


class ResponsesEndpoint(GenerationEndpoint[ResponsesRequest]):
    request_type = ResponsesRequest
    id_prefix = "resp_"
    plan: ResponsesPlan

    def __init__(
        self, request: ResponsesRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> None:
        super().__init__(request, limits, defaults)
        self.plan = plan_responses(request, limits, defaults)
        self._store = current_state().responses
        self._history: tuple[InputItem, ...] = ()
        self._parser: ToolCallParser | None = None
        """Reads the function calls out of the answer (set with the prompt)."""
        if request.previous_response_id is not None:
            previous = self._store.get(request.previous_response_id, "previous_response_id")
            self._history = previous.continued()

    async def check(self) -> None:
        await check_constraint(self.plan.params.constraint, self.plan.constraint_param)

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        req, plan = self.request, self.plan
        messages = conversation_messages(req.instructions, self._history, plan.items)
        choice = plan.tool_choice
        forced = choice == "required" or isinstance(choice, NamedFunction)
        tools = plan_tools(
            [t.as_tool() for t in plan.tools],
            choice,
            req.parallel_tool_calls,
            messages,
            chat_template=engine.chat_template,
            parser=current_state().config.tool_call_parser,
            constrain=forced or plan.params.constraint is None,
        )
        self._parser = tools.new_parser()
        if tools.constraint is not None:  # the calls' grammar (a forced one wins text.format)
            await check_constraint(tools.constraint, "tools")
            params = msgspec.structs.replace(plan.params, constraint=tools.constraint)
            self.plan = dataclasses.replace(plan, params=params)
        token_ids = await engine.apply_chat_template(
            tools.messages, chat_template_kwargs=tools.template_kwargs or None
        )
        return [Prompt(token_ids, "input")]

    def _base(self, head: ResponseHead) -> ResponseObject:
        return initial_response(
            self.request,
            self.plan,
            response_id=head.response_id,
            model=head.model,
            created=head.created,
        )

    def _finished(self, response: ResponseObject) -> None:
        if self.request.store:
            conversation = (*self._history, *self.plan.items)
            self._store.put(StoredResponse(response, conversation))

    def stream(self, head: ResponseHead) -> ResponsesStream:
        return ResponsesStream(
            self._base(head), self._finished, self.plan.top_logprobs, self._parser
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> ResponseObject:
        [output] = outputs
        return complete_response(
            self._base(head), output, self._finished, self.plan.top_logprobs, self._parser
        )


async def create_response() -> Response:
    return await serve_generation(ResponsesEndpoint)


async def retrieve_response(response_id: str) -> Response:
    return json_response(current_state().responses.get(response_id).response)


async def delete_response(response_id: str) -> Response:
    current_state().responses.delete(response_id)
    return json_response(DeletedResponse(response_id))
