"""What operators and tools ask of the server itself: GET /health and /ping (SageMaker's and
vLLM's name for it; 200 while every model has a live engine, with "degraded" when some replica
is down; 503 when some model has none), /version, /metrics (Prometheus), /openapi.json, and
GET /get_load, the per-engine load SGLang-style routers poll (vllm-router's power_of_two)."""

from __future__ import annotations

import functools

import msgspec
from quart import Response

from trio_llm import __version__
from trio_llm.http.errors import engine_unavailable
from trio_llm.http.ops.openapi import openapi_document
from trio_llm.http.runtime.bodies import json_response
from trio_llm.http.runtime.state import current_state


async def health() -> Response:
    report = current_state().health()
    if report["status"] == "unavailable":
        error = engine_unavailable()
        return json_response({**error.to_dict(), **report}, error.status, error.headers)
    return json_response(report)


async def get_load() -> Response:
    """One entry per engine, as SGLang's workers answer (one per data-parallel rank): running
    and waiting requests, and the tokens its KV cache holds."""
    state = current_state()
    loads = []
    for _, replica in state.router.replicas():
        client = replica.client
        stats = client.stats() if client is not None and replica.is_alive else None
        block_size = client.model_config.block_size if client is not None else 0
        loads.append(
            {
                "dp_rank": replica.index,
                "num_reqs": stats.num_running if stats else 0,
                "num_waiting_reqs": stats.num_waiting if stats else 0,
                "num_tokens": (
                    (stats.num_total_blocks - stats.num_free_blocks) * block_size if stats else 0
                ),
            }
        )
    return json_response(loads)


async def version() -> Response:
    return json_response({"version": __version__})


async def metrics() -> Response:
    body, content_type = current_state().metrics.render()
    return Response(body, content_type=content_type)


@functools.cache
def _openapi(lora_routes: bool) -> bytes:
    return msgspec.json.encode(openapi_document(__version__, lora_routes=lora_routes))


async def openapi_json() -> Response:
    lora_routes = current_state().config.allow_runtime_lora_updating
    return Response(_openapi(lora_routes), mimetype="application/json")
