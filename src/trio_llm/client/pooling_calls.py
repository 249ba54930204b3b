"""The pooling engine's calls: embeddings, classification and pair scores.

What it owns: `PoolingCalls`, the half of `EngineClient` (engine_client.py) that a pooling
engine serves: `embed`/`embed_batch`, `classify`, `score` (by a cross-encoder's head, or by the
cosine of two embeddings), and `_pool`, the one way they all reach the engine: every checked
input posted as its own engine request, one waiter each (embeddings.py), the unfinished ones
aborted on the way out.

Why a mixin: these are `EngineClient` methods (one object per engine, what users call), and
they share its state (the input processor, the table of pooling requests in flight, the
request ring, the liveness checks); `EngineClient` inherits them, and this module declares what
it relies on.

Invariants: every input of a call is checked (tokenized, measured, named in its error) before
any is sent; leaving a call, by return, exception or cancellation, aborts its inputs still in
the engine without an await (as `generate()` does).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from trio_llm.client.embeddings import (
    PendingEmbeddings,
    check_dimensions,
    cut_embedding,
    pooling_request,
)
from trio_llm.client.input_processor import InputProcessor
from trio_llm.client.scoring import cosine, pair_up, text_params
from trio_llm.ipc.codec import encode
from trio_llm.ipc.messages import AbortRequests, EngineReady
from trio_llm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)


class PoolingCalls:
    """The pooling calls of `EngineClient`, which provides what is declared here."""

    model_config: EngineReady
    _inputs: InputProcessor
    _embeddings: PendingEmbeddings

    if TYPE_CHECKING:  # EngineClient's, declared for the type checker only

        @property
        def task(self) -> str: ...

        def _check_alive(self) -> None: ...

        def _check_task(self, use: str) -> None: ...

        def _check_priority(self, priority: int) -> None: ...

        def _post(self, message: bytes) -> None: ...

    async def embed(
        self,
        prompt: str | list[int],
        **kwargs: Any,
    ) -> EmbeddingRequestOutput:
        """The embedding of one input (text or token ids), from a pooling engine; the keyword
        arguments are `embed_batch`'s."""
        [output] = await self.embed_batch([prompt], **kwargs)
        return output

    async def embed_batch(
        self,
        prompts: Sequence[str | list[int]],
        *,
        truncate_prompt_tokens: int | None = None,
        add_special_tokens: bool = True,
        dimensions: int | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per input, in order: the texts are tokenized together, every input is
        checked before any is sent (`PromptTooLongError` for one longer than the model takes,
        unless `truncate_prompt_tokens` cuts it: -1 for the model's length), then the engine
        packs them into its steps. `dimensions` cuts each embedding to its first that many
        (normalised again when the model normalises), for a model trained for it (Matryoshka:
        `model_config.matryoshka_dimensions`; `InvalidPromptError` otherwise). Raises
        `UnsupportedTaskError` on a generating engine.
        Cancellation (or any exception) aborts the inputs still in the engine; request i's
        engine id is `request_id-i` (just `request_id` for one input)."""
        self._check_alive()
        self._check_task("embed")
        self._check_priority(priority)
        cut = check_dimensions(self.model_config, dimensions)
        inputs = await self._inputs.embedding_inputs(
            prompts,
            truncate_prompt_tokens=truncate_prompt_tokens,
            add_special_tokens=add_special_tokens,
        )
        ids, embeddings = await self._pool(request_id, inputs, priority=priority)
        if cut is not None:
            normalized = self.model_config.normalized
            embeddings = [cut_embedding(e, cut, normalized=normalized) for e in embeddings]
        return [
            EmbeddingRequestOutput(engine_id, token_ids, EmbeddingOutput(embedding))
            for engine_id, token_ids, embedding in zip(ids, inputs, embeddings, strict=True)
        ]

    async def classify(
        self,
        prompts: Sequence[str | list[int]],
        *,
        truncate_prompt_tokens: int | None = None,
        add_special_tokens: bool = True,
        request_id: str | None = None,
        priority: int = 0,
    ) -> list[ClassificationRequestOutput]:
        """Each input's class probabilities (one per label of `model_config.labels`), in
        order, from a classifier or a cross-encoder; inputs, checks and ids as
        `embed_batch`'s. Raises `UnsupportedTaskError` on another engine."""
        self._check_alive()
        self._check_task("classify")
        inputs = await self._inputs.embedding_inputs(
            prompts,
            truncate_prompt_tokens=truncate_prompt_tokens,
            add_special_tokens=add_special_tokens,
        )
        ids, outputs = await self._pool(request_id, inputs, priority=priority)
        labels = self.model_config.labels or []
        return [
            ClassificationRequestOutput(
                engine_id,
                token_ids,
                ClassificationOutput(probs.tolist(), labels[int(np.argmax(probs))]),
            )
            for engine_id, token_ids, probs in zip(ids, inputs, outputs, strict=True)
        ]

    async def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        truncate_prompt_tokens: int | None = None,
        request_id: str | None = None,
        priority: int = 0,
        max_tokens_per_doc: int | None = None,
        names: tuple[str, str] = ("text_1", "text_2"),
    ) -> list[ScoringRequestOutput]:
        """One score per pair, in order: `text_1` against each of `text_2` (1:1 or 1:N), or
        text_1[i] against text_2[i] (N:N). A cross-encoder scores the pair in the tokenizer's
        pair encoding by its activated logit; an embedding model by the cosine of the two
        texts' embeddings (vLLM's). Every pair is checked before any is sent
        (`InvalidPromptError`, `PromptTooLongError` naming `text_1`/`text_2[i]`, or what
        `names` calls the two sides); the engine packs them into its steps with everyone
        else's. `max_tokens_per_doc` cuts each of `text_2` to its first that many tokens
        before it is paired (Cohere's rerank option). Raises `UnsupportedTaskError` on an
        engine that scores nothing (generation, a classifier of several labels)."""
        self._check_alive()
        self._check_task("score")
        firsts, seconds = pair_up(text_1, text_2, names)
        if max_tokens_per_doc is not None:
            seconds = await self._inputs.cut_texts(seconds, max_tokens_per_doc)
        params = text_params(names[1], text_2)
        if self.task == "embed":
            return await self._cosine_scores(
                firsts,
                seconds,
                text_params(names[0], text_1),
                params,
                truncate_prompt_tokens,
                request_id,
                priority,
            )
        pairs = await self._inputs.pair_inputs(
            firsts, seconds, params=params, truncate_prompt_tokens=truncate_prompt_tokens
        )
        inputs = [token_ids for token_ids, _ in pairs]
        starts = [start for _, start in pairs]
        ids, outputs = await self._pool(request_id, inputs, starts, priority=priority)
        return [
            ScoringRequestOutput(engine_id, token_ids, ScoringOutput(float(output[0])))
            for engine_id, token_ids, output in zip(ids, inputs, outputs, strict=True)
        ]

    async def _cosine_scores(
        self,
        firsts: list[str],
        seconds: list[str],
        first_params: list[str],
        params: list[str],
        truncate_prompt_tokens: int | None,
        request_id: str | None,
        priority: int,
    ) -> list[ScoringRequestOutput]:
        """An embedding model's scores: each distinct first text and every second one
        embedded once, in one batch."""
        where: dict[str, str] = {}  # each distinct first text -> the field its errors name
        for text, param in zip(
            firsts, first_params * len(firsts) if len(first_params) == 1 else first_params
        ):
            where.setdefault(text, param)
        distinct = list(where)
        texts: list[str | list[int]] = [*distinct, *seconds]
        inputs = await self._inputs.embedding_inputs(
            texts,
            truncate_prompt_tokens=truncate_prompt_tokens,
            params=[*where.values(), *params],
        )
        ids, vectors = await self._pool(request_id, inputs, priority=priority)
        by_text = {text: (inputs[i], vectors[i]) for i, text in enumerate(distinct)}
        out = []
        for i, first in enumerate(firsts):
            j = len(distinct) + i
            first_ids, first_vector = by_text[first]
            out.append(
                ScoringRequestOutput(
                    ids[j],
                    first_ids + inputs[j],
                    ScoringOutput(cosine(first_vector, vectors[j])),
                )
            )
        return out

    async def _pool(
        self,
        request_id: str | None,
        inputs: list[list[int]],
        token_type_starts: list[int] | None = None,
        *,
        priority: int,
    ) -> tuple[list[str], list[np.ndarray]]:
        """Send checked inputs to the pooling engine and wait for each one's output (float32:
        an embedding, or one score per label), in order. Request i's engine id is
        `request_id-i` (just `request_id` for one input); cancellation (or any exception)
        aborts the inputs still in the engine."""
        self._check_alive()
        base = request_id or uuid.uuid4().hex
        ids = [base] if len(inputs) == 1 else [f"{base}-{i}" for i in range(len(inputs))]
        if any(map(self._embeddings.has_request, ids)):
            raise ValueError(f"request id {base!r} is already in flight")
        starts = token_type_starts or [0] * len(inputs)
        arrival_time = time.time()
        waiters = [self._embeddings.add(engine_id) for engine_id in ids]
        try:
            for engine_id, token_ids, start in zip(ids, inputs, starts, strict=True):
                request = pooling_request(
                    engine_id,
                    token_ids,
                    arrival_time=arrival_time,
                    priority=priority,
                    token_type_start=start,
                )
                self._post(encode(request))
            outputs = [await waiter.wait() for waiter in waiters]
        finally:
            # No await here, as in generate(): this runs when the scope is cancelled too.
            unfinished = [engine_id for engine_id in ids if self._embeddings.remove(engine_id)]
            if unfinished:
                self._post(encode(AbortRequests(request_ids=unfinished)))
        return ids, outputs
