"""The client's pooled outputs -> the pooling endpoints' responses. Pure: no Quart, no engine.

Usage counts the tokens the model read, as vLLM does: every input (a pair counts its
encoding; an embedding model's score counts both texts of each pair).
Rerank's results are the documents best first, a stable sort, so equal scores keep the
documents' order (Cohere's and Jina's `index` is the document's place in the request), cut
to `top_n`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from trio_llm.http.pooling.plan import RerankPlan
from trio_llm.http.pooling.protocol import (
    ApiVersion,
    BilledUnits,
    ClassificationData,
    ClassificationResponse,
    PoolingData,
    PoolingResponse,
    PoolingUsage,
    RerankDocument,
    RerankMeta,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreResponse,
)
from trio_llm.outputs import ClassificationRequestOutput, ScoringRequestOutput


@dataclass(frozen=True, slots=True)
class Head:
    """What every pooling response repeats."""

    response_id: str
    model: str
    created: int


def prompt_tokens(outputs: Sequence[object]) -> int:
    """The tokens the model read for these outputs (each has `prompt_token_ids`)."""
    return sum(len(o.prompt_token_ids) for o in outputs)  # type: ignore[attr-defined]


def _usage(tokens: int) -> PoolingUsage:
    return PoolingUsage(prompt_tokens=tokens, total_tokens=tokens)


def pooling_response(
    head: Head, vectors: Sequence[np.ndarray], tokens: int, *, as_base64: bool
) -> PoolingResponse:
    return PoolingResponse(
        id=head.response_id,
        created=head.created,
        model=head.model,
        data=[PoolingData(index=i, data=_encoded(v, as_base64)) for i, v in enumerate(vectors)],
        usage=_usage(tokens),
    )


def pooling_body(
    head: Head, vectors: Sequence[np.ndarray], tokens: int, *, as_base64: bool
) -> bytes:
    """`pooling_response`'s JSON, one vector encoded at a time, so that on a worker thread the
    event loop gets the GIL between vectors (2,048 vectors to floats and JSON take a large
    fraction of a second, which on the loop would stall every stream)."""
    empty = pooling_response(head, [], tokens, as_base64=as_base64)
    start, end = msgspec.json.encode(empty).split(b'"data":[]', 1)
    items = [
        msgspec.json.encode(PoolingData(index=i, data=_encoded(v, as_base64)))
        for i, v in enumerate(vectors)
    ]
    return b"".join([start, b'"data":[', b",".join(items), b"]", end])


def _encoded(vector: np.ndarray, as_base64: bool) -> list[float] | str:
    if as_base64:
        return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
    return vector.tolist()


def classify_response(
    head: Head, outputs: Sequence[ClassificationRequestOutput]
) -> ClassificationResponse:
    return ClassificationResponse(
        id=head.response_id,
        created=head.created,
        model=head.model,
        data=[
            ClassificationData(
                index=i,
                label=o.outputs.label,
                probs=o.outputs.probs,
                num_classes=o.outputs.num_classes,
            )
            for i, o in enumerate(outputs)
        ],
        usage=_usage(prompt_tokens(outputs)),
    )


def score_response(head: Head, outputs: Sequence[ScoringRequestOutput]) -> ScoreResponse:
    return ScoreResponse(
        id=head.response_id,
        created=head.created,
        model=head.model,
        data=[ScoreData(index=i, score=o.outputs.score) for i, o in enumerate(outputs)],
        usage=_usage(prompt_tokens(outputs)),
    )


def rerank_response(
    head: Head,
    plan: RerankPlan,
    outputs: Sequence[ScoringRequestOutput],
    api_version: str | None = None,
) -> RerankResponse:
    """`api_version` (Cohere's, "1" or "2"): the answer carries Cohere's `meta`, billing a
    search unit per 100 documents as Cohere does."""
    scores = [o.outputs.score for o in outputs]
    best = sorted(range(len(scores)), key=lambda i: -scores[i])[: plan.top_n]
    tokens = prompt_tokens(outputs)
    return RerankResponse(
        id=head.response_id,
        model=head.model,
        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens),
        results=[
            RerankResult(
                index=i,
                relevance_score=scores[i],
                document=RerankDocument(plan.documents[i]) if plan.return_documents else None,
            )
            for i in best
        ],
        meta=None
        if api_version is None
        else RerankMeta(
            ApiVersion(api_version), BilledUnits(max(1, -(-len(plan.documents) // 100)))
        ),
    )
