"""Pooling requests -> frozen plans: what needs no model, checked before anything is admitted.

What it owns: the forms and counts of each endpoint's inputs (every bad field a 400 naming
it), rerank's documents as texts and its `top_n`, and the model use each endpoint needs
(`trio_llm.tasks`), by which the app finds a model that serves it. What needs the model
(lengths, truncation, the pairing of texts) the client checks, and its errors name the
request's fields (rerank tells the client what its two sides are called).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trio_llm.http.conversation import check_template_kwargs
from trio_llm.http.errors import bad_request
from trio_llm.http.pooling.protocol import (
    ClassificationRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from trio_llm.http.sampling import RequestLimits, prompt_forms


@dataclass(frozen=True, slots=True)
class PoolingPlan:
    inputs: list[str | list[int]] | None
    """The inputs; None when the request gives chat messages (the endpoint renders them)."""
    base64: bool


@dataclass(frozen=True, slots=True)
class ClassifyPlan:
    inputs: list[str | list[int]]


@dataclass(frozen=True, slots=True)
class ScorePlan:
    text_1: str | list[str]
    text_2: str | list[str]
    sequences: int
    """Engine requests the scores take at most (admission counts them): one per pair, and
    each first text once more for an embedding model."""


@dataclass(frozen=True, slots=True)
class RerankPlan:
    query: str
    documents: list[str]
    top_n: int
    """How many results to return, at most len(documents)."""
    return_documents: bool


def plan_pooling(request: PoolingRequest, limits: RequestLimits) -> PoolingPlan:
    if (request.input is None) == (request.messages is None):
        raise bad_request("give exactly one of input or messages", param="input")
    if request.messages is not None:
        check_template_kwargs(request.chat_template_kwargs)
        inputs = None
    else:
        assert request.input is not None
        inputs = prompt_forms(request.input, "input", limits.max_embedding_inputs)
    return PoolingPlan(inputs, request.encoding_format == "base64")


def pooling_options(request: PoolingRequest, task: str, normalized: bool) -> bool:
    """vLLM's `task`, `normalize` and `use_activation` against the model that serves the
    request (its engine's `task`, whether its engine normalises): whether the endpoint must
    normalise the vectors itself. What would change the output and cannot be done is a 400
    naming the field, as vLLM refuses a parameter its task does not take."""
    own = "embed" if task == "embed" else "classify"
    if request.task is not None and request.task not in (own, task):
        raise bad_request(
            f"Unsupported task: {request.task!r}; this model serves {own!r}", param="task"
        )
    if own == "embed":
        if request.use_activation is not None:
            raise bad_request(
                "use_activation: task embed does not take use_activation (classify does)",
                param="use_activation",
            )
        if request.normalize is False and normalized:
            raise bad_request(
                "normalize: this model's engine normalises its embeddings; unnormalised "
                "ones cannot be served",
                param="normalize",
            )
        return bool(request.normalize) and not normalized
    if request.normalize is not None:
        raise bad_request(
            "normalize: task classify does not take normalize (embed does)", param="normalize"
        )
    if request.use_activation is False:
        raise bad_request(
            "use_activation: this server's classifiers return activated scores only; raw "
            "logits cannot be served",
            param="use_activation",
        )
    return False


def plan_classify(request: ClassificationRequest, limits: RequestLimits) -> ClassifyPlan:
    return ClassifyPlan(prompt_forms(request.input, "input", limits.max_embedding_inputs))


def plan_score(request: ScoreRequest, limits: RequestLimits) -> ScorePlan:
    """The counts only; the client checks the texts and pairs them (`pair_up`)."""
    counts = {}
    for param, given in (("text_1", request.text_1), ("text_2", request.text_2)):
        count = 1 if isinstance(given, str) else len(given)
        if count == 0:
            raise bad_request(f"{param} must not be empty", param=param)
        if count > limits.max_embedding_inputs:
            raise bad_request(
                f"at most {limits.max_embedding_inputs} texts in {param}, got {count}",
                param=param,
            )
        counts[param] = count
    pairs = max(counts.values())
    return ScorePlan(request.text_1, request.text_2, pairs + counts["text_1"])


def plan_rerank(request: RerankRequest, limits: RequestLimits) -> RerankPlan:
    if not request.query:
        raise bad_request("query must not be an empty text", param="query")
    documents = [d if isinstance(d, str) else d.text for d in request.documents]
    if not documents:
        raise bad_request("documents must hold at least one document", param="documents")
    if len(documents) > limits.max_embedding_inputs:
        raise bad_request(
            f"at most {limits.max_embedding_inputs} documents per request, got {len(documents)}",
            param="documents",
        )
    for i, text in enumerate(documents):
        if not text:
            raise bad_request(f"documents[{i}] must not be an empty text", param=f"documents[{i}]")
    top_n = request.top_n
    if top_n is not None and top_n < 0:
        raise bad_request(
            f"top_n must be at least 1 (or 0 for all documents), got {top_n}", param="top_n"
        )
    count = len(documents) if not top_n else min(top_n, len(documents))
    return RerankPlan(request.query, documents, count, request.return_documents)


def chat_options(request: PoolingRequest) -> dict[str, Any]:
    """How /pooling renders its messages (`EngineClient.apply_chat_template`'s keywords)."""
    return {
        "add_generation_prompt": request.add_generation_prompt,
        "continue_final_message": request.continue_final_message,
        "chat_template_kwargs": request.chat_template_kwargs,
        "add_special_tokens": bool(request.add_special_tokens),
    }
