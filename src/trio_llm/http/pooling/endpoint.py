"""POST /pooling, /classify, /score and /rerank (/v1/rerank, /v2/rerank): the handlers.

Each is the same glue: decode the body, check the model serves the endpoint's use (a 400
naming the models that do), plan, admit the request's engine requests, route to the model's
least-loaded replica, call the client through the lease (`embed_batch`, `classify`,
`score`), build. The
client's engine packs every request's inputs into its steps with everyone else's, as it does
embeddings. As with generation, a client that goes away cancels the handler, and that aborts
the inputs still in the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import trio
from quart import Response, request

from trio_llm.client.errors import InvalidPromptError
from trio_llm.http.conversation import chat_messages
from trio_llm.http.embeddings.endpoint import ENCODE_OFF_LOOP
from trio_llm.http.errors import bad_request
from trio_llm.http.ids import new_response_id, now
from trio_llm.http.pooling.build import (
    Head,
    classify_response,
    pooling_body,
    prompt_tokens,
    rerank_response,
    score_response,
)
from trio_llm.http.pooling.plan import (
    chat_options,
    plan_classify,
    plan_pooling,
    plan_rerank,
    plan_score,
    pooling_options,
)
from trio_llm.http.pooling.protocol import (
    ClassificationRequest,
    PoolingFields,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.middleware import check_priority
from trio_llm.http.runtime.state import AppState, current_state
from trio_llm.tasks import Use

if TYPE_CHECKING:
    from trio_llm.client.lease import Lease

__all__ = ["classify", "pooling", "rerank", "score"]


R = TypeVar("R", bound=PoolingFields)


async def _decode(raw: bytes | None, kind: type[R], use: Use) -> tuple[AppState, R]:
    """The body as a `kind`, from a model that serves `use` (404, or a 400 naming those
    that do, before anything else)."""
    state = current_state()
    req = await decode_body(kind, raw)
    check_priority(req.priority)
    state.model_for(req.model, task=use)
    return state, req


def _route(
    state: AppState, req: PoolingFields, use: Use, sequences: int, id_prefix: str
) -> tuple[Lease, Head]:
    """Admit `sequences` engine requests and lease the least-loaded replica for them (the
    request runs through the lease, so `Router.abort` sees it)."""
    served, _ = state.model_for(req.model, task=use)
    state.admit(served, sequences)
    lease, model = state.lease(req.model, task=use, sequences=sequences)
    return lease, Head(new_response_id(id_prefix, req.request_id), model.name, now())


def _count(state: AppState, head: Head, tokens: int) -> None:
    state.metrics.for_model(head.model).prompt_tokens.inc(tokens)


async def pooling(raw: bytes | None = None) -> Response:
    """`raw`: the body, when the caller has read it already (/invocations); the same for
    every handler here."""
    state, req = await _decode(raw, PoolingRequest, "pooling")
    plan = plan_pooling(req, state.config.limits)
    sequences = 1 if plan.inputs is None else len(plan.inputs)
    lease, head = _route(state, req, "pooling", sequences, "pool-")
    normalize = pooling_options(req, lease.client.task, lease.client.model_config.normalized)
    inputs = plan.inputs
    if inputs is None:
        assert req.messages is not None
        messages = chat_messages(req.messages)
        inputs = [await lease.client.apply_chat_template(messages, **chat_options(req))]
    add_special = req.add_special_tokens is not False
    try:
        if lease.client.task == "embed":
            outputs: Sequence[object] = await lease.embed_batch(
                inputs,
                truncate_prompt_tokens=req.truncate_prompt_tokens,
                add_special_tokens=add_special,
                dimensions=req.dimensions,
                request_id=head.response_id,
                priority=req.priority,
            )
            vectors = [o.outputs.data for o in outputs]  # type: ignore[attr-defined]
        else:
            if req.dimensions is not None:
                raise bad_request(
                    f"dimensions: only an embedding model's outputs can be cut; `{head.model}` "
                    "gives one probability per label",
                    param="dimensions",
                )
            outputs = await lease.classify(
                inputs,
                truncate_prompt_tokens=req.truncate_prompt_tokens,
                add_special_tokens=add_special,
                request_id=head.response_id,
                priority=req.priority,
            )
            vectors = [np.asarray(o.outputs.probs, np.float32) for o in outputs]  # type: ignore[attr-defined]
    except InvalidPromptError as error:
        if plan.inputs is None and error.param.startswith("input"):
            error.param = "messages"
        raise
    if normalize:
        vectors = [v / max(float(np.linalg.norm(v)), 1e-12) for v in vectors]
    tokens = prompt_tokens(outputs)
    _count(state, head, tokens)
    if plan.base64 or sum(v.size for v in vectors) <= ENCODE_OFF_LOOP:
        body = pooling_body(head, vectors, tokens, as_base64=plan.base64)
    else:
        body = await trio.to_thread.run_sync(
            partial(pooling_body, head, vectors, tokens, as_base64=False)
        )
    return Response(body, mimetype="application/json")


async def classify(raw: bytes | None = None) -> Response:
    state, req = await _decode(raw, ClassificationRequest, "classify")
    plan = plan_classify(req, state.config.limits)
    lease, head = _route(state, req, "classify", len(plan.inputs), "classify-")
    outputs = await lease.classify(
        plan.inputs,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        add_special_tokens=req.add_special_tokens,
        request_id=head.response_id,
        priority=req.priority,
    )
    _count(state, head, prompt_tokens(outputs))
    return json_response(classify_response(head, outputs))


async def score(raw: bytes | None = None) -> Response:
    state, req = await _decode(raw, ScoreRequest, "score")
    plan = plan_score(req, state.config.limits)
    lease, head = _route(state, req, "score", plan.sequences, "score-")
    outputs = await lease.score(
        plan.text_1,
        plan.text_2,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        request_id=head.response_id,
        priority=req.priority,
    )
    _count(state, head, prompt_tokens(outputs))
    return json_response(score_response(head, outputs))


async def rerank(raw: bytes | None = None) -> Response:
    """/rerank, /v1/rerank and /v2/rerank alike (vLLM serves the three the same)."""
    state, req = await _decode(raw, RerankRequest, "score")
    plan = plan_rerank(req, state.config.limits)
    lease, head = _route(state, req, "score", len(plan.documents) + 1, "rerank-")
    outputs = await lease.score(
        plan.query,
        plan.documents,
        truncate_prompt_tokens=req.truncate_prompt_tokens,
        request_id=head.response_id,
        priority=req.priority,
        max_tokens_per_doc=req.max_tokens_per_doc,
        names=("query", "documents"),
    )
    _count(state, head, prompt_tokens(outputs))
    # Cohere's routes answer with Cohere's `meta`; vLLM's /rerank (and /invocations) without.
    version = {"/v1/rerank": "1", "/v2/rerank": "2"}.get(request.path)
    return json_response(rerank_response(head, plan, outputs, version))
