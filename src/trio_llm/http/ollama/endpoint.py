"""Ollama's API (/api/...) on the same server, engines, models and limits as the OpenAI routes.

/api/chat and /api/generate are generating endpoints of the shared skeleton
(generate/endpoint.py), so planning, the constraint check, admission, routing, and the abort
of a request whose client went away are the same as chat's; their conversation is rendered by
generate/prompt.py (tools, thinking, template) and read back by one `AnswerReader`; only the
framing differs (NDJSON, build.py). /api/embed and /api/embeddings embed through the same
lease as /v1/embeddings. The rest describe the models (models.py) or refuse.

Differences from Ollama a client can see: a body is read whatever its Content-Type (Ollama's
docs post with `curl -d`); a model's name is matched as served, or with `:latest` added;
a chat with no messages (or a generate with no prompt) answers `done_reason: "load"` at once,
as Ollama does to preload a model; `/api/embed` returns unit-length vectors, as Ollama's does,
`/api/embeddings` the model's own. Errors are `{"error": "..."}` (app.py asks `error_body`).

The request's path, top to bottom: `plan_chat` / `plan_generate` (plan.py) -> the skeleton's
checks and routing -> `prepare` (render, or tokenize a raw prompt; context; num_ctx) ->
`ChatStream` / `GenerateStream` or `chat_response` / `generate_response` (build.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import numpy as np
from quart import Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from trio_llm import __version__
from trio_llm.client.errors import ModelNotServedError
from trio_llm.http.answer import AnswerReader
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.generate.endpoint import Prompt, serve_generation
from trio_llm.http.generate.prompt import OutputFormats, render_conversation
from trio_llm.http.ids import ResponseHead, new_response_id
from trio_llm.http.ollama import models
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
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    GenerateChunk,
    GenerateRequest,
    MessageOut,
    ModelList,
    ModelRequest,
    Status,
    Version,
)
from trio_llm.http.runtime.bodies import JSON_LIMIT_KEY, decode_body, json_response
from trio_llm.http.runtime.state import AppState, ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults, check_token_ids
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient

# ---------------------------------------------------------------------------------------------
# Bodies and names


async def read_any_body() -> bytes:
    """The body, whatever its Content-Type (`curl -d` sends a form's), 413 past the limit."""
    limit = current_app.config.get(JSON_LIMIT_KEY)
    if limit is not None and (request.content_length or 0) > limit:
        raise RequestEntityTooLarge()
    data = await request.get_data(cache=False)
    if limit is not None and len(data) > limit:
        raise RequestEntityTooLarge()
    return data


def served_name(state: AppState, requested: str, task: str) -> tuple[str, ModelInfo]:
    """The served model a request names (as served, or with `:latest`), in Ollama's words
    when there is none (404) or it does not do `task` (400): generate, embed, or any."""
    names = state.router.names()
    name = requested
    if name not in names and name.endswith(":latest") and name.removesuffix(":latest") in names:
        name = name.removesuffix(":latest")
    try:
        state.router.model(name)
    except ModelNotServedError:
        served = ", ".join(f'"{n}"' for n in names)
        raise ProtocolError(
            404,
            f'model "{requested}" not found: this server serves {served} (models are chosen '
            "when it starts; they cannot be pulled)",
            param="model",
            code="model_not_found",
        ) from None
    _, card = state.model_for(name, task=None)
    if task != "any" and card.task != task:
        doing = {"generate": "generation", "embed": "embeddings"}[task]
        able = [f'"{c.name}"' for c in state.cards() if c.task == task]
        who = f"{', '.join(able)} does" if able else "no model does"
        raise bad_request(f'"{name}" does not support {doing}: on this server {who}', "model")
    return name, card


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
    """What chat and generate share (`GenerationEndpoint`)."""

    formats: OutputFormats
    clock: Clock = field(default_factory=Clock)
    """Started when the request came."""
    id_prefix: ClassVar = "ollama-"

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


@dataclass(frozen=True, slots=True)
class ChatEndpoint(_OllamaEndpoint):
    request_type: ClassVar = ChatRequest

    def plan(
        self, request: ChatRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> OllamaPlan:
        return plan_chat(request, limits, defaults)

    def stream(
        self, request: ChatRequest, prepared: PreparedOllama, head: ResponseHead
    ) -> ChatStream:
        return ChatStream(head.model, prepared.new_reader(), self.clock)

    def response(
        self,
        request: ChatRequest,
        prepared: PreparedOllama,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> ChatChunk:
        [output] = outputs
        return chat_response(head.model, output, prepared.new_reader(), self.clock)


@dataclass(frozen=True, slots=True)
class GenerateEndpoint(_OllamaEndpoint):
    request_type: ClassVar = GenerateRequest

    def plan(
        self, request: GenerateRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> OllamaPlan:
        return plan_generate(request, limits, defaults)

    def stream(
        self, request: GenerateRequest, prepared: PreparedOllama, head: ResponseHead
    ) -> GenerateStream:
        return GenerateStream(head.model, prepared.new_reader(), self.clock)

    def response(
        self,
        request: GenerateRequest,
        prepared: PreparedOllama,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> GenerateChunk:
        [output] = outputs
        return generate_response(head.model, output, prepared.new_reader(), self.clock)


def _loaded(model: str, keep_alive: object) -> str:
    """What Ollama answers a request that only loads (or, keep_alive 0, unloads) a model."""
    return "unload" if keep_alive in (0, "0", "0s") else "load"


async def api_chat() -> Response:
    clock = Clock()
    state = current_state()
    raw = await read_any_body()
    given = await decode_body(ChatRequest, raw)
    name, _ = served_name(state, given.model, "generate")
    if not given.messages:
        reason = _loaded(name, given.keep_alive)
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
        reason = _loaded(name, given.keep_alive)
        return json_response(
            GenerateChunk(
                model=name, created_at=rfc3339(), response="", done=True, done_reason=reason
            )
        )
    endpoint = GenerateEndpoint(OutputFormats.of(state.config), clock)
    return await serve_generation(endpoint, _with_model(raw, given, name))


# ---------------------------------------------------------------------------------------------
# /api/embed and /api/embeddings


async def _embed(
    state: AppState, name: str, inputs: list[str], truncate: bool, dimensions: int | None
) -> tuple[list[np.ndarray], int]:
    """Each input's embedding and the tokens read, on the model's least-loaded replica."""
    served, _ = state.model_for(name, task="embed")
    state.admit(served, len(inputs))
    lease, model = state.lease(name, task="embed", sequences=len(inputs))
    outputs = await lease.embed_batch(
        inputs,
        truncate_prompt_tokens=-1 if truncate else None,
        add_special_tokens=True,
        dimensions=dimensions,
        request_id=new_response_id("embd-"),
    )
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    state.metrics.for_model(model.name).prompt_tokens.inc(tokens)
    state.metrics.embedding_inputs.inc(len(outputs))
    return [o.outputs.data for o in outputs], tokens


def _unit(vector: np.ndarray) -> list[float]:
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 0 else vector).tolist()


async def api_embed() -> Response:
    clock = Clock()
    state = current_state()
    given = await decode_body(EmbedRequest, await read_any_body())
    name, _ = served_name(state, given.model, "embed")
    inputs = [given.input] if isinstance(given.input, str) else list(given.input)
    limit = state.config.limits.max_embedding_inputs
    if len(inputs) > limit:
        raise bad_request(f"input: at most {limit} inputs, got {len(inputs)}", param="input")
    for i, text in enumerate(inputs):
        if not text:
            where = "input" if isinstance(given.input, str) else f"input[{i}]"
            raise bad_request(f"{where}: must not be empty", param=where)
    if given.dimensions is not None and given.dimensions < 1:
        raise bad_request("dimensions: must be at least 1", param="dimensions")
    vectors, tokens = ([], 0)
    if inputs:
        vectors, tokens = await _embed(state, name, inputs, given.truncate, given.dimensions)
    timings = clock.timings()
    return json_response(
        EmbedResponse(
            model=name,
            embeddings=[_unit(v) for v in vectors],
            total_duration=timings.total_duration,
            load_duration=0,
            prompt_eval_count=tokens,
        )
    )


async def api_embeddings() -> Response:
    """The legacy /api/embeddings: one prompt, its embedding as the model gives it."""
    state = current_state()
    given = await decode_body(EmbeddingsRequest, await read_any_body())
    name, _ = served_name(state, given.model, "embed")
    if not given.prompt:
        return json_response(EmbeddingsResponse([]))
    [vector], _ = await _embed(state, name, [given.prompt], True, None)
    return json_response(EmbeddingsResponse(vector.tolist()))


# ---------------------------------------------------------------------------------------------
# Models


async def api_tags() -> Response:
    return json_response(ModelList(await models.listed(current_state())))


async def api_ps() -> Response:
    return json_response(ModelList(await models.running(current_state())))


async def api_show() -> Response:
    state = current_state()
    given = await decode_body(ModelRequest, await read_any_body())
    if not given.model_name:
        raise bad_request("model: this field is required", param="model")
    name, card = served_name(state, given.model_name, "any")
    template = None
    if card.task == "generate":
        template = state.engine_for(state.router.model(name)).chat_template
    return json_response(await models.show(state, card, template))


async def api_version() -> Response:
    return json_response(Version(models.OLLAMA_API_VERSION, __version__))


async def api_pull() -> Response:
    """A model already served is there: success at once; any other is refused."""
    state = current_state()
    given = await decode_body(ModelRequest, await read_any_body())
    names = state.router.names()
    wanted = given.model_name
    if wanted in names or wanted.removesuffix(":latest") in names:
        return json_response(Status("success"))
    raise models.refuse_management(f'pull of "{wanted}"', names)


def _refusal(action: str) -> Callable[..., Any]:
    async def refuse(**_: object) -> Response:
        raise models.refuse_management(action, current_state().router.names())

    refuse.__name__ = f"api_{action}"
    return refuse


api_push = _refusal("push")
api_create = _refusal("create")
api_copy = _refusal("copy")
api_delete = _refusal("delete")
api_blobs = _refusal("blobs")
