"""POST /api/chat and /api/generate: Ollama's generation, on the same server, engines, models
and limits as the OpenAI routes.

Both are generating endpoints of the shared skeleton (generate/endpoint.py), so planning, the
constraint check, admission, routing, and the abort of a request whose client went away are
chat's; their conversation is rendered by generate/prompt.py (tools, thinking, template) and
read back by one `AnswerReader`; only the framing differs (NDJSON, build.py). A chat with no
messages (or a generate with no prompt) answers `done_reason: "load"` at once, as Ollama does
to preload a model (`unload` with keep_alive 0). Errors are `{"error": "..."}` (app.py asks
`error_body`).

The request's path, top to bottom: `served_name` (served.py) -> `plan_chat` / `plan_generate`
(plan.py) -> the skeleton's checks and routing -> `prepare` (render, or tokenize a raw prompt;
context; num_ctx) -> `ChatStream` / `GenerateStream` or `chat_response` /
`generate_response` (build.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
from quart import Response

from trio_llm.http.answer import AnswerReader
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.generate.endpoint import Prompt, serve_generation
from trio_llm.http.generate.prompt import OutputFormats, render_conversation
from trio_llm.http.ids import ResponseHead
from trio_llm.http.ollama.build import (
    ChatStream,
    Clock,
    GenerateStream,
    chat_response,
    generate_response,
    rfc3339,
)
from trio_llm.http.ollama.plan import OllamaPlan, plan_chat, plan_generate
from trio_llm.http.ollama.protocol import (
    ChatChunk,
    ChatRequest,
    GenerateChunk,
    GenerateRequest,
    MessageOut,
)
from trio_llm.http.ollama.served import read_any_body, served_name
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults, check_token_ids
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


def _with_model(raw: bytes, given: msgspec.Struct, name: str) -> bytes:
    """The body naming the served model (what the skeleton routes by)."""
    if getattr(given, "model", None) == name:
        return raw
    return msgspec.json.encode(msgspec.structs.replace(given, model=name))


# ---------------------------------------------------------------------------------------------
# /api/chat and /api/generate


@dataclass(frozen=True, slots=True)
class PreparedOllama:
    plan: OllamaPlan
    prompts: list[Prompt]
    params: SamplingParams
    new_reader: Callable[[], AnswerReader]


def _fit_context(
    params: SamplingParams, prompt: int, plan: OllamaPlan, served: int
) -> SamplingParams:
    """`options.num_ctx` smaller than the served context: prompt and answer must fit in it."""
    num_ctx = plan.num_ctx
    if num_ctx is None or num_ctx >= served:
        return params
    room = num_ctx - prompt
    if room < 1:
        raise ProtocolError(
            400,
            f"options.num_ctx: the prompt's {prompt} tokens leave no room for an answer in "
            f"num_ctx {num_ctx}",
            param="options.num_ctx",
            code="context_length_exceeded",
        )
    if params.max_tokens is not None and params.max_tokens <= room:
        return params
    return msgspec.structs.replace(params, max_tokens=room)


@dataclass(frozen=True, slots=True)
class _OllamaEndpoint:
    """What chat and generate share (`GenerationEndpoint`); each says its request type, plan,
    stream builder and response."""

    formats: OutputFormats
    clock: Clock = field(default_factory=Clock)
    """Started when the request came."""
    id_prefix: ClassVar = "ollama-"
    plan_request: ClassVar[Callable[..., OllamaPlan]]
    stream_type: ClassVar[type[ChatStream | GenerateStream]]
    respond: ClassVar[Callable[..., ChatChunk | GenerateChunk]]

    def plan(self, request: Any, limits: RequestLimits, defaults: SamplingDefaults) -> OllamaPlan:
        return self.plan_request(request, limits, defaults)

    async def prepare(
        self, request: Any, plan: OllamaPlan, engine: EngineClient, model: ModelInfo
    ) -> PreparedOllama:
        params = plan.params
        new_reader: Callable[[], AnswerReader] = AnswerReader
        if plan.conversation is None:
            assert plan.raw_prompt is not None
            token_ids = await engine.encode(plan.raw_prompt, add_special_tokens=True)
        else:
            rendered = await render_conversation(engine, plan.conversation, self.formats)
            if plan.thinks and rendered.reasoning.format is None:
                raise bad_request(f'"{model.name}" does not support thinking', param="think")
            token_ids, params, new_reader = (
                rendered.token_ids,
                rendered.params(params),
                rendered.new_reader,
            )
        if plan.context:
            context = list(plan.context)
            check_token_ids(context, model.vocab_size, "context")
            token_ids = context + token_ids
        params = _fit_context(params, len(token_ids), plan, model.max_model_len)
        param = "messages" if isinstance(request, ChatRequest) else "prompt"
        return PreparedOllama(plan, [Prompt(token_ids, param)], params, new_reader)

    def stream(
        self, request: Any, prepared: PreparedOllama, head: ResponseHead
    ) -> ChatStream | GenerateStream:
        return self.stream_type(head.model, prepared.new_reader(), self.clock)

    def response(
        self,
        request: Any,
        prepared: PreparedOllama,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> ChatChunk | GenerateChunk:
        [output] = outputs
        return self.respond(head.model, output, prepared.new_reader(), self.clock)


@dataclass(frozen=True, slots=True)
class ChatEndpoint(_OllamaEndpoint):
    request_type: ClassVar = ChatRequest
    plan_request = staticmethod(plan_chat)
    stream_type = ChatStream
    respond = staticmethod(chat_response)


@dataclass(frozen=True, slots=True)
class GenerateEndpoint(_OllamaEndpoint):
    request_type: ClassVar = GenerateRequest
    plan_request = staticmethod(plan_generate)
    stream_type = GenerateStream
    respond = staticmethod(generate_response)


def _loaded(keep_alive: object) -> str:
    """What Ollama answers a request that only loads (or, keep_alive 0, unloads) a model."""
    return "unload" if keep_alive in (0, "0", "0s") else "load"


async def api_chat() -> Response:
    clock = Clock()
    state = current_state()
    raw = await read_any_body()
    given = await decode_body(ChatRequest, raw)
    name, _ = served_name(state, given.model, "generate")
    if not given.messages:
        reason = _loaded(given.keep_alive)
        message = MessageOut(role="assistant", content="")
        return json_response(
            ChatChunk(
                model=name, created_at=rfc3339(), message=message, done=True, done_reason=reason
            )
        )
    endpoint = ChatEndpoint(OutputFormats.of(state.config), clock)
    return await serve_generation(endpoint, _with_model(raw, given, name))


async def api_generate() -> Response:
    clock = Clock()
    state = current_state()
    raw = await read_any_body()
    given = await decode_body(GenerateRequest, raw)
    name, _ = served_name(state, given.model, "generate")
    if not given.prompt:
        reason = _loaded(given.keep_alive)
        return json_response(
            GenerateChunk(
                model=name, created_at=rfc3339(), response="", done=True, done_reason=reason
            )
        )
    endpoint = GenerateEndpoint(OutputFormats.of(state.config), clock)
    return await serve_generation(endpoint, _with_model(raw, given, name))
