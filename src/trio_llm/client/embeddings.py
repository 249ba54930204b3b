"""Embeddings on the frontend side of a pooling engine: the requests in flight, the request
message, and the Matryoshka cut.

What it owns: one waiter per engine request, which the output handler completes with the
engine's pooled output (or fails) and `EngineClient.embed_batch` awaits (a pooling request gets
exactly one output from the engine, so there is nothing to detokenize and nothing to merge);
the `EngineCoreRequest` of one input; which `dimensions` a model may be cut to
(`check_dimensions`) and the cut itself, normalised again when the model normalises
(`cut_embedding`).

Invariants: like the output processor, everything here is synchronous and never waits; a
waiter is completed at most once, and a request is forgotten as soon as it is (or as soon as
its caller leaves), so a late output for it is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio
import numpy as np

from trio_llm.client.background import in_background
from trio_llm.client.errors import EngineDeadError, EngineRequestError, InvalidPromptError
from trio_llm.ipc.messages import EngineCoreOutput, EngineCoreRequest, EngineReady
from trio_llm.sampling_params import SamplingParams

_POOLING_PARAMS = SamplingParams()
"""What a pooling request carries as its (unused) sampling parameters."""


def pooling_request(
    request_id: str,
    token_ids: list[int],
    *,
    arrival_time: float,
    priority: int,
    token_type_start: int = 0,
) -> EngineCoreRequest:
    """The engine request of one input (`token_type_start`: a pair's second text's first
    token, from which a model with token types gives type 1)."""
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=token_ids,
        sampling_params=_POOLING_PARAMS,
        arrival_time=arrival_time,
        priority=priority,
        background=in_background(),
        pooling=True,
        token_type_start=token_type_start,
    )


def check_dimensions(model: EngineReady, dimensions: int | None) -> int | None:
    """The size to cut embeddings to, None for none; `InvalidPromptError` (param
    `dimensions`) for one the model was not trained for."""
    if dimensions is None or dimensions == model.embedding_size:
        return None
    allowed = model.matryoshka_dimensions
    if (
        allowed is None
        or not 1 <= dimensions <= model.embedding_size
        or (allowed and dimensions not in allowed)
    ):
        sizes = (
            "it was not trained to be cut shorter"
            if allowed is None
            else f"it can be cut to {', '.join(map(str, allowed)) or 'any size'}"
        )
        raise InvalidPromptError(
            f"the model {model.model!r} cannot give embeddings of {dimensions} dimensions: "
            f"its own have {model.embedding_size}, and {sizes}",
            param="dimensions",
        )
    return dimensions


def cut_embedding(embedding: np.ndarray, size: int, *, normalized: bool) -> np.ndarray:
    """The first `size` dimensions (Matryoshka), normalised again when the model normalises."""
    cut = embedding[:size]
    if normalized:
        cut = cut / max(float(np.linalg.norm(cut)), 1e-12)
    return cut.astype(np.float32, copy=False)


class EmbeddingWaiter:
    __slots__ = ("_done", "error", "result")

    def __init__(self) -> None:
        self._done = anyio.Event()
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None

    def set(self, result: np.ndarray | None, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self._done.set()

    async def wait(self) -> np.ndarray:
        await self._done.wait()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class PendingEmbeddings:
    def __init__(self) -> None:
        self._waiters: dict[str, EmbeddingWaiter] = {}

    @property
    def num_requests(self) -> int:
        return len(self._waiters)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._waiters

    def add(self, request_id: str) -> EmbeddingWaiter:
        """Track a request before it is sent, so no output can arrive for an unknown id."""
        if request_id in self._waiters:
            raise ValueError(f"request id {request_id!r} is already in flight")
        waiter = self._waiters[request_id] = EmbeddingWaiter()
        return waiter

    def remove(self, request_id: str) -> bool:
        """Forget a request whose caller has gone; True if the engine still has it."""
        return self._waiters.pop(request_id, None) is not None

    def process_outputs(self, outputs: Sequence[EngineCoreOutput], now: float) -> list[str]:
        """Complete the waiters of one engine step's outputs; nothing to abort (the signature
        is the output processor's)."""
        for output in outputs:
            waiter = self._waiters.pop(output.request_id, None)
            if waiter is None:
                continue
            if output.pooled is not None:
                waiter.set(np.frombuffer(output.pooled, dtype=np.float32), None)
            elif output.finish_reason == "abort":
                waiter.set(None, EngineRequestError("the request was aborted"))
            else:
                message = output.error or "the engine returned no embedding"
                waiter.set(None, EngineRequestError(message))
        return []

    def abort_request(self, request_id: str) -> list[str]:
        """Fail a request from elsewhere (`EngineClient.abort`); its engine id to abort."""
        waiter = self._waiters.pop(request_id, None)
        if waiter is None:
            return []
        waiter.set(None, EngineRequestError("the request was aborted"))
        return [request_id]

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every waiter; an input still waiting was not computed (a pooling step computes
        an input whole), so it counts as not started (the router may run it elsewhere)."""
        for waiter in self._waiters.values():
            error = make_error()
            if isinstance(error, EngineDeadError):
                error.started = False
            waiter.set(None, error)
        self._waiters.clear()
