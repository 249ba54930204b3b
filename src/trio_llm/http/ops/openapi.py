"""/openapi.json, generated from each API folder's wire types (its protocol.py's WIRE_TYPES).

Invariant: the schema a fuzzer (schemathesis) or a client generator reads is derived from the
same Structs the server decodes bodies into, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trio_llm.http.anthropic import protocol as anthropic
from trio_llm.http.audio import protocol as audio
from trio_llm.http.chat import protocol as chat
from trio_llm.http.completions import protocol as completions
from trio_llm.http.embeddings import protocol as embeddings
from trio_llm.http.generate import protocol as generate
from trio_llm.http.lora import protocol as lora
from trio_llm.http.models import protocol as models
from trio_llm.http.ollama import protocol as ollama
from trio_llm.http.pooling import protocol as pooling
from trio_llm.http.responses import protocol as responses

_ERROR_STATUSES = (
    (400, "Invalid request: the message names the parameter"),
    (401, "Missing or wrong API key"),
    (404, "Unknown model"),
    (413, "Body larger than --max-body-size"),
    (415, "Body is not JSON (multipart/form-data for the audio routes)"),
    (503, "Queue full or engine restarting; see Retry-After"),
)

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


_ANTHROPIC_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            "required": ["type", "message"],
        },
    },
    "required": ["type", "error"],
}
"""The errors of the Messages API's routes: Anthropic's shape."""


def _ollama_paths() -> dict[str, Any]:
    """Ollama's API: NDJSON streams (its default), `{"error": "..."}` errors."""

    def post(summary: str, request: type, response: type, *, streams: bool) -> dict[str, Any]:
        path = _post(summary, request, response, streams=False, errors="ErrorLine")
        if streams:
            content = path["post"]["responses"]["200"]["content"]
            content["application/x-ndjson"] = {"schema": _ref(response.__name__)}
        return path

    return {
        "/api/chat": post("Ollama's chat", ollama.ChatRequest, ollama.ChatChunk, streams=True),
        "/api/generate": post(
            "Ollama's generate", ollama.GenerateRequest, ollama.GenerateChunk, streams=True
        ),
        "/api/embed": post(
            "Ollama's embeddings", ollama.EmbedRequest, ollama.EmbedResponse, streams=False
        ),
        "/api/embeddings": post(
            "Ollama's legacy embedding",
            ollama.EmbeddingsRequest,
            ollama.EmbeddingsResponse,
            streams=False,
        ),
        "/api/show": post(
            "One served model, in Ollama's terms",
            ollama.ModelRequest,
            ollama.ShowResponse,
            streams=False,
        ),
        "/api/tags": _get("The served models, in Ollama's terms", ollama.Tags),
        "/api/ps": _get("The served models with a live engine", ollama.Running),
        "/api/version": _get("The Ollama API version followed", ollama.Version),
    }


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(kind: type) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(kind.__name__)}}


def _errors(schema: str = "ErrorResponse") -> dict[str, Any]:
    errors: dict[str, Any] = {}
    for status, text in _ERROR_STATUSES:
        errors |= _errors_for(status, text, schema)
    return errors


def _errors_for(status: int, text: str, schema: str = "ErrorResponse") -> dict[str, Any]:
    return {
        str(status): {
            "description": text,
            "content": {"application/json": {"schema": _ref(schema)}},
        }
    }


def _post(
    summary: str,
    request: type,
    response: type,
    *,
    streams: bool,
    many: bool = False,
    errors: str = "ErrorResponse",
) -> dict[str, Any]:
    """`many`: the response is a JSON array of `response`; `errors`: the schema of its
    errors."""
    content = _json(response)
    if many:
        content["application/json"]["schema"] = {"type": "array", "items": _ref(response.__name__)}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": {"200": {"description": "OK", "content": content}, **_errors(errors)},
        }
    }


def _audio_post(summary: str) -> dict[str, Any]:
    """A multipart form: the file beside AudioForm's text fields; the answer is JSON, text,
    srt or vtt by `response_format`, or transcript.text.* events with `stream`."""
    form = {
        "allOf": [
            _ref(audio.AudioForm.__name__),
            {
                "type": "object",
                "properties": {"file": {"type": "string", "format": "binary"}},
                "required": ["file"],
            },
        ]
    }
    content = {
        "application/json": {
            "schema": {"oneOf": [_ref(audio.Transcription.__name__), _ref("TranscriptionVerbose")]}
        },
        "text/plain": {"schema": {"type": "string"}},
        "text/vtt": {"schema": {"type": "string"}},
        "application/x-subrip": {"schema": {"type": "string"}},
        "text/event-stream": {"schema": {"type": "string"}},
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form}}},
            "responses": {"200": {"description": "OK", "content": content}, **_errors()},
        }
    }


def _get(summary: str, response: type | None = None, **extra: Any) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    if response is not None:
        ok["content"] = _json(response)
    return {"get": {"summary": summary, "responses": {"200": ok}, **extra}}


def _text_post(summary: str, request: type) -> dict[str, Any]:
    """A POST answered by a line of plain text (vLLM's LoRA routes)."""
    text = {"text/plain": {"schema": {"type": "string"}}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": {"200": {"description": "OK", "content": text}, **_errors()},
        }
    }


def openapi_document(version: str, *, lora_routes: bool = False) -> dict[str, Any]:
    """OpenAPI 3.1 for every route the server has (`lora_routes`: with
    --allow-runtime-lora-updating)."""
    loras = {
        "/v1/load_lora_adapter": _text_post(
            "Load a LoRA adapter (a PEFT directory on the server) on a base model",
            lora.LoadLoraAdapterRequest,
        ),
        "/v1/unload_lora_adapter": _text_post(
            "Unload a LoRA adapter (its requests in flight finish)", lora.UnloadLoraAdapterRequest
        ),
    }
    _, schemas = msgspec.json.schema_components(
        (
            *audio.WIRE_TYPES,
            *chat.WIRE_TYPES,
            *completions.WIRE_TYPES,
            *embeddings.WIRE_TYPES,
            *models.WIRE_TYPES,
            *responses.WIRE_TYPES,
            *anthropic.WIRE_TYPES,
            *pooling.WIRE_TYPES,
            *lora.WIRE_TYPES,
            *generate.WIRE_TYPES,
            *ollama.WIRE_TYPES,
        ),
        ref_template="#/components/schemas/{name}",
    )
    schemas["ErrorResponse"] = _ERROR_SCHEMA
    schemas["AnthropicError"] = _ANTHROPIC_ERROR_SCHEMA
    model_param = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    response_param = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    stored = _errors_for(404, "No stored response with that id (never stored, evicted, deleted)")
    return {
        "openapi": "3.1.0",
        "info": {"title": "trio-llm", "version": version},
        "paths": {
            "/v1/chat/completions": _post(
                "Chat completion",
                chat.ChatCompletionRequest,
                chat.ChatCompletionResponse,
                streams=True,
            ),
            "/v1/completions": _post(
                "Text completion",
                completions.CompletionRequest,
                completions.CompletionResponse,
                streams=True,
            ),
            "/v1/chat/completions/render": _post(
                "A chat completion's prompt token ids, rendered and not generated (vLLM's)",
                chat.ChatCompletionRequest,
                generate.RenderedPrompt,
                streams=False,
            ),
            "/v1/completions/render": _post(
                "Each prompt's token ids, not generated (vLLM's; a list, one per prompt)",
                completions.CompletionRequest,
                generate.RenderedPrompt,
                streams=False,
                many=True,
            ),
            "/v1/embeddings": _post(
                "Embeddings of texts or token ids",
                embeddings.EmbeddingRequest,
                embeddings.EmbeddingResponse,
                streams=False,
            ),
            "/v1/audio/transcriptions": _audio_post(
                "Speech to text in the spoken language, from a model served for speech"
            ),
            "/v1/audio/translations": _audio_post(
                "Speech to English text, from a multilingual speech model"
            ),
            "/v1/responses": _post(
                "Responses API: a response to input items (with the history of "
                "previous_response_id); streamed as response.* events",
                responses.ResponsesRequest,
                responses.ResponseObject,
                streams=True,
            ),
            "/v1/responses/render": _post(
                "A Responses request's prompt token ids, rendered and not generated (vLLM's)",
                responses.ResponsesRequest,
                generate.RenderedPrompt,
                streams=False,
            ),
            "/v1/responses/{response_id}": {
                "get": {
                    "summary": "A stored response",
                    "parameters": [response_param],
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": _json(responses.ResponseObject),
                        },
                        **stored,
                    },
                },
                "delete": {
                    "summary": "Forget a stored response",
                    "parameters": [response_param],
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": _json(responses.DeletedResponse),
                        },
                        **stored,
                    },
                },
            },
            "/v1/messages": _post(
                "Anthropic's Messages API: a message in content blocks (thinking, text, "
                "tool_use); streamed as Anthropic's events",
                anthropic.MessagesRequest,
                anthropic.Message,
                streams=True,
                errors="AnthropicError",
            ),
            "/v1/messages/count_tokens": _post(
                "The prompt tokens a Messages request renders to, tools included",
                anthropic.CountTokensRequest,
                anthropic.TokenCount,
                streams=False,
                errors="AnthropicError",
            ),
            "/pooling": _post(
                "Pooled outputs of inputs or chat messages (embeddings, or a classifier's "
                "probabilities)",
                pooling.PoolingRequest,
                pooling.PoolingResponse,
                streams=False,
            ),
            "/classify": _post(
                "Labels and probabilities of inputs, from a classifier or cross-encoder",
                pooling.ClassificationRequest,
                pooling.ClassificationResponse,
                streams=False,
            ),
            **{
                path: _post(
                    "Scores of text pairs: text_1 against one or many text_2 (a cross-encoder's "
                    "logit, or an embedding model's cosine)",
                    pooling.ScoreRequest,
                    pooling.ScoreResponse,
                    streams=False,
                )
                for path in ("/score", "/v1/score")
            },
            **{
                path: _post(
                    "Documents ranked against a query (vLLM's, Jina's and Cohere's shapes)",
                    pooling.RerankRequest,
                    pooling.RerankResponse,
                    streams=False,
                )
                for path in ("/rerank", "/v1/rerank", "/v2/rerank")
            },
            "/invocations": {
                "post": {
                    "summary": "Chat completion (a body with messages), text completion (a "
                    "body with prompt), embeddings or classification (a body with input), "
                    "scores (text_1) or a rerank (query), as vLLM's SageMaker-style route",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [
                                        _ref(chat.ChatCompletionRequest.__name__),
                                        _ref(completions.CompletionRequest.__name__),
                                        _ref(embeddings.EmbeddingRequest.__name__),
                                        _ref(pooling.ClassificationRequest.__name__),
                                        _ref(pooling.ScoreRequest.__name__),
                                        _ref(pooling.RerankRequest.__name__),
                                    ]
                                }
                            }
                        },
                    },
                    "responses": {"200": {"description": "OK"}, **_errors()},
                }
            },
            "/tokenize": _post(
                "Tokenize a prompt or chat messages",
                models.TokenizeRequest,
                models.TokenizeResponse,
                streams=False,
            ),
            "/detokenize": _post(
                "Token ids to text",
                models.DetokenizeRequest,
                models.DetokenizeResponse,
                streams=False,
            ),
            "/v1/models": _get("Served models", models.ModelList),
            "/v1/models/{model}": _get(
                "One served model", models.ModelCard, parameters=[model_param]
            ),
            "/health": _get(
                "200 while every model has a live engine ('degraded' when a replica is down), "
                "503 otherwise"
            ),
            "/ping": _get("The same as /health (SageMaker's and vLLM's name)"),
            "/version": _get("Server version"),
            "/metrics": _get("Prometheus metrics"),
            **_ollama_paths(),
            **(loras if lora_routes else {}),
        },
        "components": {"schemas": schemas},
    }
