"""The ASGI app: Quart-Trio routes gluing the OpenAI protocol to an `EngineClient`.

Handlers only glue: decode and validate (protocol.py), admit (admission.py), tokenize, call
`generate()`, and hand outputs to the builders (responses.py). Errors are translated once, here,
into `ProtocolError`s (`translate_error`), both for plain responses and for a stream that has
already begun.

Invariants:
- Every request runs in Quart-Trio's per-request nursery. A client that goes away (EOF on
  HTTP/1.1, RST_STREAM on HTTP/2) cancels that nursery, and the cancellation unwinding through
  `generate()` is what aborts the request in the engine; nothing polls for disconnects, for
  streaming and non-streaming requests alike.
- Streaming responses have `timeout = None`: Quart's 60 s default would silently cut them.
- What a request holds (its admission ticket) is released when its ASGI call ends, however it
  ends, even if the response body was never started.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, ExitStack, aclosing, asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio
from quart import Response, request
from quart.wrappers.response import ResponseBody
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from trio_llm import __version__
from trio_llm.client.errors import (
    ChatTemplateError,
    EngineDeadError,
    EngineRequestError,
    InvalidPromptError,
    PromptTooLongError,
)
from trio_llm.http.admission import Admission
from trio_llm.http.config import ServerConfig, config_from_env
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.metrics import Metrics, RequestRecorder
from trio_llm.http.openapi import openapi_document
from trio_llm.http.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    chat_messages,
    check_model,
    check_token_ids,
    decode_request,
    fit_context,
    plan_chat,
    plan_completion,
)
from trio_llm.http.responses import (
    SSE_DONE,
    ChatStream,
    CompletionStream,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
    chat_response,
    completion_response,
    merge_final,
    new_response_id,
    now,
    sse_error,
    sse_event,
)
from trio_llm.http.supervisor import EngineGaveUpError, supervise_engine
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:
    from trio_llm.client import EngineClient

log = logging.getLogger(__name__)

_EXTENSION = "trio_llm"
_CLEANUP = "trio_llm.cleanup"
_PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")

_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


# ---------------------------------------------------------------------------------------------
# State


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_model_len: int
    vocab_size: int
    created: int


@dataclass
class AppState:
    """What the routes share: the config, the current engine (None while it is down)."""

    config: ServerConfig
    metrics: Metrics = field(init=False)
    admission: Admission = field(init=False)
    engine: EngineClient | None = None
    model: ModelInfo | None = None
    engine_failed: trio.Event = field(default_factory=trio.Event)
    """Set when the supervisor gives up; `trio-llm serve` then exits non-zero."""
    _supervisor_scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    _supervisor_done: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        self.metrics = Metrics(self._engine_stats)
        self.admission = Admission(self.config.capacity)

    def _engine_stats(self) -> Any | None:
        engine = self.engine
        return engine.stats() if engine is not None and engine.is_alive else None

    def attach(self, engine: EngineClient | None) -> None:
        """Called by the supervisor (or build_app) when an engine comes up or goes down."""
        self.engine = engine
        if engine is not None:
            mc = engine.model_config
            self.model = ModelInfo(mc.model, mc.max_model_len, mc.vocab_size, now())

    def require_engine(self) -> tuple[EngineClient, ModelInfo]:
        engine, model = self.engine, self.model
        if engine is None or model is None or not engine.is_alive:
            raise ProtocolError(
                503,
                "The engine is not running (it is starting or restarting); retry later",
                code="engine_unavailable",
                headers={"Retry-After": "2"},
            )
        return engine, model


def _state() -> AppState:
    from quart import current_app

    return current_app.extensions[_EXTENSION]


# ---------------------------------------------------------------------------------------------
# Errors


def translate_error(error: BaseException) -> ProtocolError:
    """The one place an exception becomes what the client sees."""
    if isinstance(error, ProtocolError):
        return error
    if isinstance(error, SamplingParamsError):
        return bad_request(str(error), param=error.param)
    if isinstance(error, PromptTooLongError):
        return bad_request(str(error), param=error.param, code="context_length_exceeded")
    if isinstance(error, InvalidPromptError):
        return bad_request(str(error), param=error.param)
    if isinstance(error, ChatTemplateError):
        return bad_request(str(error), param="messages")
    if isinstance(error, EngineDeadError):
        return ProtocolError(500, f"The engine died: {error}", code="engine_dead")
    if isinstance(error, EngineRequestError):
        return ProtocolError(500, f"The engine failed this request: {error}", code="engine_error")
    log.error("unexpected error", exc_info=error)
    return ProtocolError(500, "Internal server error", code="internal_error")


def _json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        msgspec.json.encode(payload), status=status, headers=headers, mimetype="application/json"
    )


def _error_response(error: ProtocolError) -> Response:
    return _json_response(error.to_dict(), error.status, error.headers)


def _http_error(error: HTTPException) -> ProtocolError:
    status = error.code or 500
    headers = {}
    if status == 404:
        message = f"Not found: {request.method} {request.path}"
    elif status == 405:
        message = f"Method {request.method} is not allowed on {request.path}"
        headers = {k: v for k, v in error.get_headers() if k.lower() == "allow"}
    elif status == 413:
        limit = _state().config.max_body_size
        message = f"The request body is larger than the limit of {limit} bytes"
    else:
        message = error.description or error.name
    return ProtocolError(status, message, headers=headers)


# ---------------------------------------------------------------------------------------------
# Request plumbing


class _CleanupMiddleware:
    """Gives each HTTP request an ExitStack that closes when its ASGI call ends, which is the
    only point that comes after both the handler and the response body, whatever happened."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with ExitStack() as stack:
            scope[_CLEANUP] = stack
            await self.app(scope, receive, send)


def _admit(state: AppState, sequences: int) -> None:
    try:
        ticket = state.admission.admit_nowait(sequences)
    except ProtocolError:
        state.metrics.rejected.inc()
        raise
    request.scope[_CLEANUP].callback(ticket.release)


async def _json_body() -> bytes:
    mimetype = request.mimetype
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise ProtocolError(
            415,
            f"Content-Type must be application/json, got {mimetype}",
            code="unsupported_media_type",
        )
    return await request.get_data(cache=False)  # 413 past MAX_CONTENT_LENGTH


def _check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    for key in kwargs or ():
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise bad_request(
                f"chat_template_kwargs may not set {key!r}", param="chat_template_kwargs"
            )


def _validate_vocab(params: SamplingParams, vocab_size: int) -> None:
    try:
        params.validate_vocab(vocab_size)
    except SamplingParamsError as error:
        raise bad_request(str(error), param=error.param) from None


class _ContextBody(ResponseBody):
    """A response body produced inside an async context manager. Quart enters it around the
    whole send loop, in the request's task, so the context may hold a nursery (running one
    `generate()` per prompt) that an async generator alone may not."""

    def __init__(self, context: AbstractAsyncContextManager[AsyncIterator[bytes]]) -> None:
        self._context = context

    async def __aenter__(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        return await self._context.__aenter__()

    async def __aexit__(  # type: ignore[override]
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._context.__aexit__(exc_type, exc, tb)


class _Builder(Protocol):
    def begin(self) -> list[Any]: ...
    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]: ...
    def end(self) -> list[Any]: ...


Generations = list[AsyncGenerator[RequestOutput, None]]


async def _indexed(
    index: int, outputs: AsyncIterator[RequestOutput], recorder: RequestRecorder
) -> AsyncIterator[tuple[int, RequestOutput]]:
    async for output in outputs:
        recorder.record(output)
        yield index, output


@asynccontextmanager
async def _merged(
    generations: Generations, metrics: Metrics
) -> AsyncIterator[AsyncIterator[tuple[int, RequestOutput]]]:
    """Outputs of all of a request's prompts as (prompt index, output), as they arrive.

    One prompt is iterated directly. Several run side by side in a nursery held by this
    context (never inside an async generator); leaving the context early cancels them all,
    and each cancelled `generate()` aborts its engine request."""
    if len(generations) == 1:
        async with (
            aclosing(generations[0]) as only,
            aclosing(_indexed(0, only, metrics.recorder())) as outputs,
        ):
            yield outputs
        return

    async def produce(
        index: int, generation: AsyncGenerator[RequestOutput, None], send: trio.MemorySendChannel
    ) -> None:
        async with send, aclosing(generation):
            recorder = metrics.recorder()
            try:
                async for output in generation:
                    recorder.record(output)
                    await send.send((index, output))
            except Exception as error:  # delivered in order, raised by the consumer
                await send.send((index, error))

    async def consume(
        receive: trio.MemoryReceiveChannel,
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        async for index, item in receive:
            if isinstance(item, Exception):
                raise item
            yield index, item

    send, receive = trio.open_memory_channel[tuple[int, Any]](0)
    async with receive, trio.open_nursery() as nursery:
        async with send:
            for index, generation in enumerate(generations):
                nursery.start_soon(produce, index, generation, send.clone())
        try:
            async with aclosing(consume(receive)) as outputs:
                yield outputs
        finally:
            nursery.cancel_scope.cancel()


async def _sse_events(
    outputs: AsyncIterator[tuple[int, RequestOutput]], builder: _Builder
) -> AsyncIterator[bytes]:
    try:
        for chunk in builder.begin():
            yield sse_event(chunk)
        async for index, output in outputs:
            for chunk in builder.feed(index, output):
                yield sse_event(chunk)
        for chunk in builder.end():
            yield sse_event(chunk)
    except Exception as error:  # the 200 is out: the error becomes an event
        yield sse_error(translate_error(error))
    yield SSE_DONE


@asynccontextmanager
async def _sse_stream(
    generations: Generations, builder: _Builder, metrics: Metrics
) -> AsyncIterator[AsyncIterator[bytes]]:
    async with (
        _merged(generations, metrics) as outputs,
        aclosing(_sse_events(outputs, builder)) as events,
    ):
        yield events


def _sse_response(generations: Generations, builder: _Builder, metrics: Metrics) -> Response:
    response = Response(
        _ContextBody(_sse_stream(generations, builder, metrics)),
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.timeout = None
    return response


async def _collect(generations: Generations, metrics: Metrics) -> list[RequestOutput]:
    """Each prompt's finished output (FINAL_ONLY), in prompt order."""
    per_prompt: list[list[RequestOutput]] = [[] for _ in generations]
    async with _merged(generations, metrics) as outputs:
        async for index, output in outputs:
            per_prompt[index].append(output)
    return [merge_final(outputs) for outputs in per_prompt]


def _engine_request_ids(response_id: str, count: int, user_given: bool) -> list[str]:
    """Engine ids must be unique even when clients reuse a request_id."""
    suffix = f"-{uuid.uuid4().hex[:8]}" if user_given else ""
    if count == 1:
        return [response_id + suffix]
    return [f"{response_id}-{i}{suffix}" for i in range(count)]


# ---------------------------------------------------------------------------------------------
# The app


def _make_app(state: AppState) -> QuartTrio:
    config = state.config
    app = QuartTrio(__name__)
    app.extensions[_EXTENSION] = state
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_size
    app.asgi_app = _CleanupMiddleware(app.asgi_app)  # type: ignore[method-assign]
    openapi = msgspec.json.encode(openapi_document(__version__))
    key = config.api_key.encode("utf-8") if config.api_key else None

    if config.allowed_origins:
        from quart_cors import cors

        origins = list(config.allowed_origins)
        app = cors(
            app,
            allow_origin="*" if "*" in origins else origins,
            allow_headers=["Authorization", "Content-Type"],
            allow_methods=["GET", "POST", "OPTIONS"],
        )

    @app.before_request
    async def authenticate() -> None:
        if key is None or request.method == "OPTIONS":
            return
        path = request.path
        if not config.protect_all_routes and not path.startswith(_PROTECTED_PREFIXES):
            return
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = token.strip().encode("latin-1")
        # compare_digest runs in time independent of where the strings differ.
        if not (scheme.lower() == "bearer" and hmac.compare_digest(given, key)):
            raise ProtocolError(
                401,
                "Missing or incorrect API key: send it as `Authorization: Bearer <key>`",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.after_request
    async def count_request(response: Response) -> Response:
        rule = request.url_rule
        state.metrics.http_requests.labels(
            request.method, rule.rule if rule is not None else "unmatched", response.status_code
        ).inc()
        return response

    @app.errorhandler(ProtocolError)
    async def protocol_error(error: ProtocolError) -> Response:
        return _error_response(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        return _error_response(_http_error(error))

    @app.errorhandler(Exception)
    async def other_error(error: Exception) -> Response:
        return _error_response(translate_error(error))

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        req = decode_request(await _json_body(), ChatCompletionRequest)
        engine, model = state.require_engine()
        check_model(req.model, model.name)
        plan = plan_chat(req, config.limits)
        _check_template_kwargs(req.chat_template_kwargs)
        _admit(state, plan.params.n)
        try:
            prompt = await engine.apply_chat_template(
                plan.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs,
            )
        except ChatTemplateError as error:
            raise bad_request(str(error), param="messages") from None
        fit_context(
            len(prompt),
            plan.params.max_tokens,
            model.max_model_len,
            prompt_param="messages",
            max_tokens_param=plan.max_tokens_param,
        )
        _validate_vocab(plan.params, model.vocab_size)
        response_id = new_response_id("chatcmpl", req.request_id)
        [engine_id] = _engine_request_ids(response_id, 1, req.request_id is not None)
        generations = [
            engine.generate(prompt, plan.params, request_id=engine_id, priority=req.priority)
        ]
        created = now()
        if req.stream:
            builder = ChatStream(
                response_id=response_id,
                model=model.name,
                created=created,
                n=plan.params.n,
                top_logprobs=plan.top_logprobs,
                include_usage=req.include_usage,
            )
            return _sse_response(generations, builder, state.metrics)
        [output] = await _collect(generations, state.metrics)
        return _json_response(
            chat_response(
                response_id=response_id,
                model=model.name,
                created=created,
                output=output,
                top_logprobs=plan.top_logprobs,
            )
        )

    @app.post("/v1/completions")
    async def completions() -> Response:
        req = decode_request(await _json_body(), CompletionRequest)
        engine, model = state.require_engine()
        check_model(req.model, model.name)
        plan = plan_completion(req, config.limits)
        _admit(state, plan.params.n * len(plan.prompts))
        prompts: list[list[int]] = []
        for i, prompt in enumerate(plan.prompts):
            param = "prompt" if len(plan.prompts) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                ids = await engine.encode(prompt)
            else:
                check_token_ids(prompt, model.vocab_size, param)
                ids = prompt
            fit_context(
                len(ids),
                plan.params.max_tokens,
                model.max_model_len,
                prompt_param=param,
                max_tokens_param="max_tokens",
            )
            prompts.append(ids)
        _validate_vocab(plan.params, model.vocab_size)
        echo_texts = None
        if plan.echo:
            echo_texts = [p if isinstance(p, str) else engine.decode(p) for p in plan.prompts]
        response_id = new_response_id("cmpl", req.request_id)
        ids = _engine_request_ids(response_id, len(prompts), req.request_id is not None)
        generations = [
            engine.generate(p, plan.params, request_id=i, priority=req.priority)
            for p, i in zip(prompts, ids, strict=True)
        ]
        created = now()
        if req.stream:
            builder = CompletionStream(
                response_id=response_id,
                model=model.name,
                created=created,
                n=plan.params.n,
                logprobs=plan.logprobs,
                include_usage=req.include_usage,
                echo_texts=echo_texts,
            )
            return _sse_response(generations, builder, state.metrics)
        outputs = await _collect(generations, state.metrics)
        return _json_response(
            completion_response(
                response_id=response_id,
                model=model.name,
                created=created,
                outputs=outputs,
                n=plan.params.n,
                logprobs=plan.logprobs,
                echo_texts=echo_texts,
            )
        )

    @app.get("/v1/models")
    async def models() -> Response:
        model = _model_or_503(state)
        return _json_response(ModelList([_card(model)]))

    @app.get("/v1/models/<path:model_id>")
    async def model_card(model_id: str) -> Response:
        model = _model_or_503(state)
        check_model(model_id, model.name)
        return _json_response(_card(model))

    @app.post("/tokenize")
    async def tokenize() -> Response:
        req = decode_request(await _json_body(), TokenizeRequest)
        engine, model = state.require_engine()
        check_model(req.model, model.name)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt or messages", param="prompt")
        if req.prompt is not None:
            add_special = True if req.add_special_tokens is None else req.add_special_tokens
            ids = await engine.encode(req.prompt, add_special_tokens=add_special)
        else:
            assert req.messages is not None
            _check_template_kwargs(req.chat_template_kwargs)
            try:
                ids = await engine.apply_chat_template(
                    chat_messages(req.messages),
                    add_generation_prompt=req.add_generation_prompt,
                    continue_final_message=req.continue_final_message,
                    chat_template_kwargs=req.chat_template_kwargs,
                )
            except ChatTemplateError as error:
                raise bad_request(str(error), param="messages") from None
        strs = engine.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
        response = TokenizeResponse(len(ids), model.max_model_len, ids)
        if strs is not None:
            response.token_strs = list(strs)
        return _json_response(response)

    @app.post("/detokenize")
    async def detokenize() -> Response:
        req = decode_request(await _json_body(), DetokenizeRequest)
        engine, model = state.require_engine()
        check_model(req.model, model.name)
        check_token_ids(req.tokens, model.vocab_size, "tokens")
        return _json_response(DetokenizeResponse(engine.decode(req.tokens)))

    @app.get("/health")
    async def health() -> Response:
        engine = state.engine
        if engine is None or not engine.is_alive:
            error = ProtocolError(503, "The engine is not running", code="engine_unavailable")
            return _error_response(error)
        return _json_response({"status": "ok"})

    @app.get("/version")
    async def version() -> Response:
        return _json_response({"version": __version__})

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, content_type=content_type)

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return Response(openapi, mimetype="application/json")

    return app


def _model_or_503(state: AppState) -> ModelInfo:
    if state.model is None:
        raise ProtocolError(
            503, "The engine is starting; retry later", headers={"Retry-After": "2"}
        )
    return state.model


def _card(model: ModelInfo) -> ModelCard:
    return ModelCard(model.name, model.created, model.max_model_len)


def build_app(engine_client: EngineClient, *, config: ServerConfig | None = None) -> QuartTrio:
    """The app over an engine the caller owns (and keeps open while the app serves)."""
    state = AppState(config or ServerConfig())
    state.attach(engine_client)
    return _make_app(state)


_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str, *, root: bool = True) -> None:
    """Log to stderr at `level`, unless the process already set logging up. `root=False`
    configures only trio-llm's loggers (under a Hypercorn that logs its own lines)."""
    if logging.getLogger().handlers:
        return
    if root:
        logging.basicConfig(level=level.upper(), format=_LOG_FORMAT)
        return
    logger = logging.getLogger("trio_llm")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_LOG_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(level.upper())


def create_app(config: ServerConfig | None = None) -> QuartTrio:
    """The app that owns its engine: its lifespan starts the engine (config from the
    TRIO_LLM_* environment when none is given), restarts it if it dies, and stops it."""
    state = AppState(config or config_from_env())
    setup_logging(state.config.log_level, root=False)
    app = _make_app(state)

    async def run_supervisor(task_status: trio.TaskStatus[None]) -> None:
        try:
            with state._supervisor_scope:
                await supervise_engine(
                    state.config.engine,
                    state.attach,
                    restart=state.config.restart_engine,
                    max_restarts_per_minute=state.config.max_restarts_per_minute,
                    task_status=task_status,
                )
        except EngineGaveUpError as error:
            log.critical("%s", error)
            state.engine_failed.set()
        finally:
            state._supervisor_done.set()

    @app.before_serving
    async def start_engine() -> None:
        await app.nursery.start(run_supervisor)

    @app.after_serving
    async def stop_engine() -> None:
        state._supervisor_scope.cancel()
        with contextlib.suppress(trio.TooSlowError):
            with trio.fail_after(60):
                await state._supervisor_done.wait()

    return app


def app_state(app: QuartTrio) -> AppState:
    return app.extensions[_EXTENSION]
