"""POST /api/embed and the legacy POST /api/embeddings: Ollama's embeddings, through the same
lease, admission and engine batch as /v1/embeddings.

/api/embed takes a text or a list (`truncate`, default true: cut to the model's length;
`dimensions` as the model allows) and answers unit-length vectors, as Ollama's does, with
`prompt_eval_count`; /api/embeddings takes one `prompt` and answers the model's own vector. A
client that goes away cancels the handler, which aborts the inputs still in the engine.
"""

from __future__ import annotations

import msgspec
import numpy as np
import trio
from quart import Response

from trio_llm.client.embeddings import cut_embedding
from trio_llm.http.embeddings.endpoint import ENCODE_OFF_LOOP
from trio_llm.http.errors import bad_request
from trio_llm.http.ids import new_response_id
from trio_llm.http.ollama.build import Clock
from trio_llm.http.ollama.protocol import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
)
from trio_llm.http.ollama.served import read_any_body, served_name
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import AppState, current_state


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


def _embed_body(name: str, vectors: list[np.ndarray], tokens: int, clock: Clock) -> bytes:
    """The answer's JSON, the vectors made unit length, as Ollama's are."""
    embeddings = [cut_embedding(v, v.size, normalized=True).tolist() for v in vectors]
    response = EmbedResponse(
        model=name,
        embeddings=embeddings,
        total_duration=clock.timings().total_duration,
        load_duration=0,
        prompt_eval_count=tokens,
    )
    return msgspec.json.encode(response)


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
    vectors, tokens = ([], 0)
    if inputs:
        vectors, tokens = await _embed(state, name, inputs, given.truncate, given.dimensions)
    if sum(v.size for v in vectors) <= ENCODE_OFF_LOOP:
        body = _embed_body(name, vectors, tokens, clock)
    else:  # a large batch's JSON takes a while: off the event loop
        body = await trio.to_thread.run_sync(_embed_body, name, vectors, tokens, clock)
    return Response(body, mimetype="application/json")


async def api_embeddings() -> Response:
    """The legacy /api/embeddings: one prompt, its embedding as the model gives it."""
    state = current_state()
    given = await decode_body(EmbeddingsRequest, await read_any_body())
    name, _ = served_name(state, given.model, "embed")
    if not given.prompt:
        return json_response(EmbeddingsResponse([]))
    [vector], _ = await _embed(state, name, [given.prompt], True, None)
    return json_response(EmbeddingsResponse(vector.tolist()))
