"""The ASGI app: `build_app` over an engine the caller owns, `create_app` owning its own.

Assembles the pieces: the app state (runtime/state.py), middleware (runtime/middleware.py),
the routes, one line each, to the handlers of each API folder (`<api>/endpoint.py`), the error
handlers, and the lifespan (runtime/lifespan.py). An endpoint that generates is a
`GenerationEndpoint` (generate/endpoint.py) plus its line in `_ROUTES`. Errors are translated
once (`translate_error`, errors.py), here for plain responses and in generate/streams.py for a
stream that has already begun.

Invariant: every request runs in Quart-Trio's per-request nursery. A client that goes away
(EOF on HTTP/1.1, RST_STREAM on HTTP/2) cancels that nursery, and the cancellation unwinding
through `generate()` is what aborts the request in the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from trio_llm.http import ollama
from trio_llm.http.anthropic import endpoint as anthropic
from trio_llm.http.anthropic.protocol import error_body
from trio_llm.http.audio import endpoint as audio
from trio_llm.http.batch import endpoint as batch
from trio_llm.http.chat import endpoint as chat
from trio_llm.http.completions import endpoint as completions
from trio_llm.http.config import ServerConfig
from trio_llm.http.embeddings import endpoint as embeddings
from trio_llm.http.errors import ProtocolError, from_http_exception, translate_error
from trio_llm.http.invocations import endpoint as invocations
from trio_llm.http.lora import endpoint as lora
from trio_llm.http.model_specs import ModelSpec
from trio_llm.http.models import endpoint as models
from trio_llm.http.ollama.protocol import error_body as ollama_error_body
from trio_llm.http.ops import endpoint as ops
from trio_llm.http.pooling import endpoint as pooling
from trio_llm.http.responses import endpoint as responses
from trio_llm.http.runtime.bodies import JSON_LIMIT_KEY, error_response
from trio_llm.http.runtime.lifespan import fix_hypercorn_when_serving, own_engines, setup_logging
from trio_llm.http.runtime.middleware import install_middleware
from trio_llm.http.runtime.state import AppState, install_state
from trio_llm.http.serve_flags import config_from_env
from trio_llm.http.ui import endpoint as ui

if TYPE_CHECKING:
    from trio_llm.client import EngineClient

_ROUTES: tuple[tuple[str, str, Callable[..., Awaitable[Response]]], ...] = (
    ("POST", "/v1/chat/completions", chat.chat_completions),
    ("POST", "/v1/chat/completions/render", chat.render_chat_completion),
    ("POST", "/v1/completions", completions.completions),
    ("POST", "/v1/completions/render", completions.render_completion),
    ("POST", "/v1/embeddings", embeddings.embeddings),
    ("POST", "/v1/audio/transcriptions", audio.transcriptions),
    ("POST", "/v1/audio/translations", audio.translations),
    ("POST", "/v1/responses", responses.create_response),
    ("POST", "/v1/responses/render", responses.render_response),
    ("GET", "/v1/responses/<response_id>", responses.retrieve_response),
    ("DELETE", "/v1/responses/<response_id>", responses.delete_response),
    ("POST", "/v1/files", batch.upload_file),
    ("GET", "/v1/files", batch.list_files),
    ("GET", "/v1/files/<file_id>", batch.retrieve_file),
    ("DELETE", "/v1/files/<file_id>", batch.delete_file),
    ("GET", "/v1/files/<file_id>/content", batch.file_content),
    ("POST", "/v1/batches", batch.create_batch),
    ("GET", "/v1/batches", batch.list_batches),
    ("GET", "/v1/batches/<batch_id>", batch.retrieve_batch),
    ("POST", "/v1/batches/<batch_id>/cancel", batch.cancel_batch),
    ("POST", "/v1/messages", anthropic.create_message),
    ("POST", "/v1/messages/count_tokens", anthropic.count_tokens),
    ("POST", "/pooling", pooling.pooling),
    ("POST", "/classify", pooling.classify),
    ("POST", "/score", pooling.score),
    ("POST", "/v1/score", pooling.score),
    ("POST", "/rerank", pooling.rerank),
    ("POST", "/v1/rerank", pooling.rerank),
    ("POST", "/v2/rerank", pooling.rerank),
    ("POST", "/invocations", invocations.invocations),
    ("GET", "/v1/models", models.list_models),
    ("GET", "/v1/models/<path:model_id>", models.model_card),
    ("POST", "/tokenize", models.tokenize),
    ("POST", "/detokenize", models.detokenize),
    ("GET", "/health", ops.health),
    ("GET", "/ping", ops.health),
    ("POST", "/ping", ops.health),
    ("GET", "/version", ops.version),
    ("GET", "/get_load", ops.get_load),
    ("GET", "/metrics", ops.metrics),
    ("GET", "/openapi.json", ops.openapi_json),
    ("POST", "/api/chat", ollama.api_chat),
    ("POST", "/api/generate", ollama.api_generate),
    ("POST", "/api/embed", ollama.api_embed),
    ("POST", "/api/embeddings", ollama.api_embeddings),
    ("GET", "/api/tags", ollama.api_tags),
    ("POST", "/api/show", ollama.api_show),
    ("GET", "/api/ps", ollama.api_ps),
    ("GET", "/api/version", ollama.api_version),
    ("POST", "/api/pull", ollama.api_pull),
    ("POST", "/api/push", ollama.api_push),
    ("POST", "/api/create", ollama.api_create),
    ("POST", "/api/copy", ollama.api_copy),
    ("DELETE", "/api/delete", ollama.api_delete),
    ("POST", "/api/blobs/<digest>", ollama.api_blobs),
    ("HEAD", "/api/blobs/<digest>", ollama.api_blobs),
    ("GET", "/", ui.chat_page),
    ("GET", "/ui/<name>", ui.asset),
)
_LORA_ROUTES: tuple[tuple[str, str, Callable[..., Awaitable[Response]]], ...] = (
    ("POST", "/v1/load_lora_adapter", lora.load_lora_adapter),
    ("POST", "/v1/unload_lora_adapter", lora.unload_lora_adapter),
)
"""Only with --allow-runtime-lora-updating."""


def _make_app(state: AppState) -> QuartTrio:
    config = state.config
    app = QuartTrio(__name__)
    install_state(app, state)
    # The audio routes' forms may be larger than a JSON body; read_body holds JSON bodies to
    # max_body_size itself.
    app.config["MAX_CONTENT_LENGTH"] = max(
        config.max_body_size, config.max_audio_size + audio.FORM_SLACK
    )
    app.config[JSON_LIMIT_KEY] = config.max_body_size
    app = install_middleware(app, config, state.metrics)
    _handle_errors(app, config)
    routes = _ROUTES + (_LORA_ROUTES if config.allow_runtime_lora_updating else ())
    for method, path, handler in routes:
        app.add_url_rule(path, view_func=handler, methods=[method])
    if config.batch_dir is not None:
        batch.install_batches(app, state, config.batch_dir)
    fix_hypercorn_when_serving(app)
    return app


_ANTHROPIC_PATHS = "/v1/messages"
"""Errors under this path take Anthropic's shape (its SDKs read no other)."""
_OLLAMA_PATHS = "/api/"
"""Errors under this path take Ollama's shape, `{"error": "..."}`."""


def _error(error: ProtocolError) -> Response:
    if request.path.startswith(_OLLAMA_PATHS):
        return Response(
            ollama_error_body(error),
            status=error.status,
            headers=error.headers,
            mimetype="application/json",
        )
    if request.path.startswith(_ANTHROPIC_PATHS):
        return Response(
            error_body(error),
            status=error.status,
            headers=error.headers,
            mimetype="application/json",
        )
    return error_response(error)


def _handle_errors(app: QuartTrio, config: ServerConfig) -> None:
    @app.errorhandler(ProtocolError)
    async def protocol_error(error: ProtocolError) -> Response:
        return _error(error)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        return _error(
            from_http_exception(
                error,
                method=request.method,
                path=request.path,
                max_body_size=config.max_body_size,
            )
        )

    @app.errorhandler(Exception)
    async def other_error(error: Exception) -> Response:
        return _error(translate_error(error))


def build_app(*engine_clients: EngineClient, config: ServerConfig | None = None) -> QuartTrio:
    """The app over engines the caller owns (and keeps open while the app serves): one model
    each, served under its name; the first is the default."""
    config = config or ServerConfig()
    specs = tuple(ModelSpec(config.engine) for _ in engine_clients)
    state = AppState(dataclasses.replace(config, models=specs))
    for group, client in enumerate(engine_clients):
        state.attach(group, 0, client)
    return _make_app(state)


def create_app(config: ServerConfig | None = None) -> QuartTrio:
    """The app that owns its engine: its lifespan starts the engine (config from the
    TRIO_LLM_* environment when none is given), restarts it if it dies, and stops it."""
    state = AppState(config or config_from_env())
    setup_logging(state.config.log_level, root=False)
    app = _make_app(state)
    own_engines(app, state)
    return app
