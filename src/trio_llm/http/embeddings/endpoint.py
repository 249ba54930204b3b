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

from quart import Response

from trio_llm.http.embeddings.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from trio_llm.http.ids import new_response_id, now
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import current_state
from trio_llm.http.sampling import RequestLimits, prompt_forms
from trio_llm.outputs import EmbeddingRequestOutput


@dataclass(frozen=True, slots=True)
class EmbeddingPlan:
    inputs: list[str | list[int]]
    base64: bool


def plan_embedding(request: EmbeddingRequest, limits: RequestLimits) -> EmbeddingPlan:
    """What needs no model: the inputs' form and count (`dimensions` the client checks)."""
    inputs = prompt_forms(request.input, "input", limits.max_embedding_inputs)
    return EmbeddingPlan(inputs, request.encoding_format == "base64")


async def embeddings(raw: bytes | None = None) -> Response:
    """`raw`: the body, when the caller has read it already (/invocations)."""
    state = current_state()
    req = await decode_body(EmbeddingRequest, raw)
    served, _ = state.model_for(req.model, task="embed")  # 404 or 400 before anything else
    plan = plan_embedding(req, state.config.limits)
    state.admit(served, len(plan.inputs))
    lease, model = state.lease(req.model, task="embed", sequences=len(plan.inputs))
    response_id = new_response_id("embd-", req.request_id)
    outputs = await lease.embed_batch(
        plan.inputs,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        add_special_tokens=req.add_special_tokens,
        dimensions=req.dimensions,
        request_id=response_id,
        priority=req.priority,
    )
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    state.metrics.for_model(model.name).prompt_tokens.inc(tokens)
    state.metrics.embedding_inputs.inc(len(outputs))
    return json_response(
        EmbeddingResponse(
            id=response_id,
            created=now(),
            model=model.name,
            data=[_data(i, o, plan.base64) for i, o in enumerate(outputs)],
            usage=EmbeddingUsage(tokens, tokens),
        )
    )


def _data(index: int, output: EmbeddingRequestOutput, as_base64: bool) -> EmbeddingData:
    vector = output.outputs.data
    if as_base64:
        encoded = base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
        return EmbeddingData(index=index, embedding=encoded)
    return EmbeddingData(index=index, embedding=vector.tolist())
