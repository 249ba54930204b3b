"""POST /v1/embeddings: one embedding per input (a text, texts, token ids or lists of token
ids), as floats or base64 of little-endian float32 (OpenAI's `encoding_format`), from a model
served for embeddings.

The inputs run as one `embed_batch` on the model's least-loaded replica, which packs them into
its steps; the request holds that replica for as many sequences as it has inputs. As with
generation, a client that goes away cancels the handler, and that aborts the inputs still in
the engine.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import trio
from quart import Response

from trio_llm.http.conversation import chat_messages, check_template_kwargs
from trio_llm.http.embeddings.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from trio_llm.http.errors import bad_request
from trio_llm.http.ids import new_response_id, now
from trio_llm.http.runtime.bodies import by_body_size, decode_body, read_body
from trio_llm.http.runtime.middleware import check_priority
from trio_llm.http.runtime.state import current_state
from trio_llm.http.sampling import RequestLimits, prompt_forms

ENCODE_OFF_LOOP = 1 << 16
"""Floats past which a response's JSON is encoded on a worker thread, one embedding at a time
(a batch of 2048 inputs of 4096 dimensions takes a second to encode)."""


@dataclass(frozen=True, slots=True)
class EmbeddingPlan:
    inputs: list[str | list[int]]
    """Empty with `messages`: the one input is the conversation, once rendered."""
    base64: bool
    messages: list[dict[str, Any]] | None = None


def plan_embedding(request: EmbeddingRequest, limits: RequestLimits) -> EmbeddingPlan:
    """What needs no model: the inputs' form and count (`dimensions` the client checks)."""
    as_base64 = request.encoding_format == "base64"
    if (request.input is None) == (request.messages is None):
        raise bad_request("give exactly one of input or messages", param="input")
    if request.messages is not None:
        check_template_kwargs(request.chat_template_kwargs)
        return EmbeddingPlan([], as_base64, chat_messages(request.messages))
    inputs = prompt_forms(request.input, "input", limits.max_embedding_inputs)
    return EmbeddingPlan(inputs, as_base64)


async def embeddings(raw: bytes | None = None) -> Response:
    """`raw`: the body, when the caller has read it already (/invocations)."""
    state = current_state()
    if raw is None:
        raw = await read_body()
    req = await decode_body(EmbeddingRequest, raw)
    check_priority(req.priority)
    served, _ = state.model_for(req.model, task="embed")  # 404 or 400 before anything else
    plan = await by_body_size(len(raw), plan_embedding, req, state.config.limits)
    sequences = len(plan.inputs) or 1
    state.admit(served, sequences)
    lease, model = state.lease(req.model, task="embed", sequences=sequences)
    response_id = new_response_id("embd-", req.request_id)
    inputs = plan.inputs
    add_special_tokens = req.add_special_tokens
    if plan.messages is not None:
        inputs = [
            await lease.client.apply_chat_template(
                plan.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs,
                add_special_tokens=bool(add_special_tokens),
            )
        ]
        add_special_tokens = False  # the rendering has them as asked
    outputs = await lease.embed_batch(
        inputs,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        add_special_tokens=add_special_tokens is not False,
        dimensions=req.dimensions,
        request_id=response_id,
        priority=req.priority,
    )
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    state.metrics.for_model(model.name).prompt_tokens.inc(tokens)
    state.metrics.embedding_inputs.inc(len(outputs))
    response = EmbeddingResponse(
        id=response_id,
        created=now(),
        model=model.name,
        data=[],
        usage=EmbeddingUsage(tokens, tokens),
    )
    vectors = [o.outputs.data for o in outputs]
    if plan.base64 or sum(v.size for v in vectors) <= ENCODE_OFF_LOOP:
        body = _encode(response, vectors, plan.base64)
    else:
        body = await trio.to_thread.run_sync(_encode, response, vectors, False)
    return Response(body, mimetype="application/json")


def _encode(response: EmbeddingResponse, vectors: list[np.ndarray], as_base64: bool) -> bytes:
    """The response's JSON with `vectors` as its data, one embedding encoded at a time (so a
    worker thread lets the event loop in between)."""
    head, tail = msgspec.json.encode(response).split(b'"data":[]', 1)
    items = [msgspec.json.encode(_data(i, v, as_base64)) for i, v in enumerate(vectors)]
    return b"".join([head, b'"data":[', b",".join(items), b"]", tail])


def _data(index: int, vector: np.ndarray, as_base64: bool) -> EmbeddingData:
    if as_base64:
        encoded = base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
        return EmbeddingData(index=index, embedding=encoded)
    return EmbeddingData(index=index, embedding=vector.tolist())
