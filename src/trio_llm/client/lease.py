"""A request's hold on the replica the router picked for it (`Lease`).

What it owns: the load the request counts on its replica (its sequences: n choices of a prompt,
or one per embedding input) until it is released; the requests it runs there (`generate`,
`embed_batch`, `score`, `classify`, `transcribe`), entered in the router's table of requests in
flight (`request_id -> Lease`, what `Router.abort` reads) while they run; and the move of a
request whose replica died before the engine started it to another live replica of the model.

Invariants:
- A request stays on the replica it was routed to for its whole life, unless that replica dies
  before starting it (`EngineDeadError.started` is False): then it is sent again on another,
  once per replica at most. One that had started fails with the engine's error.
- A lease is released exactly once (`release` is idempotent; `leased` releases a stream's lease
  however the stream ends), so a replica's load never leaks, and its requests leave the table
  of requests in flight with it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from trio_llm.client.engine_client import EngineClient
from trio_llm.client.errors import EngineDeadError
from trio_llm.client.images import ImagePrompt
from trio_llm.client.lora import LoraRequest
from trio_llm.client.prefix_index import PrefixPolicy
from trio_llm.client.replicas import Replica, ServedModel

if TYPE_CHECKING:
    from trio_llm.client.speech import AudioInput
    from trio_llm.outputs import (
        ClassificationRequestOutput,
        EmbeddingRequestOutput,
        RequestOutput,
        ScoringRequestOutput,
        TranscriptionOutput,
    )
    from trio_llm.sampling_params import SamplingParams

log = logging.getLogger(__name__)

T = TypeVar("T")


class Lease:
    """A request's hold on its replica: `sequences` of its load until `release()`, and the
    requests it runs there (`generate`, `embed_batch`, `score`, `classify`,
    `transcribe`), which `Router.abort` finds by id until then. `client` is the replica's engine,
    for what is not a request (tokenizing).

    A request whose replica dies before the engine started it (it was still waiting there:
    `EngineDeadError.started` is False) is moved: the lease takes another live replica of the
    model and sends the request again, once per replica at most; one that had started fails
    with the engine's error."""

    __slots__ = ("_holders", "_model", "_policy", "_request_ids", "client", "replica", "sequences")

    def __init__(
        self,
        holders: dict[str, Lease],
        policy: PrefixPolicy,
        model: ServedModel,
        replica: Replica,
        sequences: int,
    ) -> None:
        """`holders`: the router's table of requests in flight; `policy`: its choice of another
        replica for a moved request."""
        assert replica.client is not None
        self._holders: dict[str, Lease] | None = holders
        """None once released."""
        self._policy = policy
        self._model = model
        self.replica = replica
        self.client: EngineClient = replica.client
        self.sequences = sequences
        self._request_ids: list[str] = []
        replica.load += sequences

    def generate(
        self,
        prompt: str | list[int] | ImagePrompt,
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: int = 0,
        lora: str | LoraRequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """`EngineClient.generate` on the leased replica (`ValueError` for an id in flight);
        what it raises before returning, it raises here."""
        request_id = self._hold(request_id)
        tried = {id(self.replica)}
        try:
            stream = self._generate_here(prompt, params, request_id, priority, lora, tried)
        except BaseException:
            self._forget(request_id)
            raise
        return self._moving(stream, prompt, params, request_id, priority, lora, tried)

    def _generate_here(
        self,
        prompt: str | list[int] | ImagePrompt,
        params: SamplingParams,
        request_id: str,
        priority: int,
        lora: str | LoraRequest | None,
        tried: set[int],
    ) -> AsyncGenerator[RequestOutput, None]:
        """`generate` on the leased replica, or on another if it is found dead."""
        while True:
            try:
                return self.client.generate(
                    prompt, params, request_id=request_id, priority=priority, lora=lora
                )
            except EngineDeadError:
                if not self._move(tried):
                    raise

    async def _moving(
        self,
        stream: AsyncGenerator[RequestOutput, None],
        prompt: str | list[int] | ImagePrompt,
        params: SamplingParams,
        request_id: str,
        priority: int,
        lora: str | LoraRequest | None,
        tried: set[int],
    ) -> AsyncGenerator[RequestOutput, None]:
        while True:
            try:
                async for output in stream:
                    yield output
                return
            except EngineDeadError as error:
                if error.started or not self._move(tried):
                    raise
                log.warning(
                    "request %s: its replica died before starting it; retrying on replica %s",
                    request_id,
                    self.replica.label,
                )
            finally:
                await stream.aclose()
            stream = self._generate_here(prompt, params, request_id, priority, lora, tried)

    async def embed_batch(
        self, prompts: Sequence[str | list[int]], *, request_id: str | None = None, **kwargs: Any
    ) -> list[EmbeddingRequestOutput]:
        """`EngineClient.embed_batch` on the leased replica (moved as `generate` is)."""
        return await self._pooled(
            lambda client, rid: client.embed_batch(prompts, request_id=rid, **kwargs), request_id
        )

    async def _pooled(
        self, call: Callable[[EngineClient, str], Awaitable[T]], request_id: str | None
    ) -> T:
        """`call` (a pooling request: embed, score, classify) on the leased replica, moved to
        another when the replica dies before it started it."""
        request_id = self._hold(request_id)
        tried = {id(self.replica)}
        try:
            while True:
                try:
                    return await call(self.client, request_id)
                except EngineDeadError as error:
                    if error.started or not self._move(tried):
                        raise
        finally:
            self._forget(request_id)

    def _move(self, tried: set[int]) -> bool:
        """Take another live replica of the model, one not tried yet; False if none is."""
        if self._holders is None:
            return False
        if self.replica.is_alive and id(self.replica) not in tried:
            tried.add(id(self.replica))  # another request of this lease moved it already
            return True
        replica = self._model.pick((), self._policy, exclude=self.replica)
        if replica is None or id(replica) in tried:
            return False
        tried.add(id(replica))
        assert replica.client is not None
        self.replica.load -= self.sequences
        replica.load += self.sequences
        self.replica, self.client = replica, replica.client
        return True

    async def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        request_id: str | None = None,
        **kwargs: Any,
    ) -> list[ScoringRequestOutput]:
        """`EngineClient.score` on the leased replica."""
        return await self._pooled(
            lambda client, rid: client.score(text_1, text_2, request_id=rid, **kwargs), request_id
        )

    async def classify(
        self, prompts: Sequence[str | list[int]], *, request_id: str | None = None, **kwargs: Any
    ) -> list[ClassificationRequestOutput]:
        """`EngineClient.classify` on the leased replica."""
        return await self._pooled(
            lambda client, rid: client.classify(prompts, request_id=rid, **kwargs), request_id
        )

    def transcribe(
        self, audio: AudioInput, *, request_id: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[TranscriptionOutput, None]:
        """`EngineClient.transcribe` on the leased replica (`ValueError` for an id in flight)."""
        request_id = self._hold(request_id)
        try:
            return self.client.transcribe(audio, request_id=request_id, **kwargs)
        except BaseException:
            self._forget(request_id)
            raise

    def _hold(self, request_id: str | None) -> str:
        """Record that this lease runs `request_id` (a new id when None)."""
        holders = self._holders
        if holders is None:
            raise RuntimeError("this lease was released")
        request_id = request_id or uuid.uuid4().hex
        if request_id in holders:
            raise ValueError(f"request id {request_id!r} is already in flight")
        holders[request_id] = self
        self._request_ids.append(request_id)
        return request_id

    def _forget(self, request_id: str) -> None:
        if self._holders is not None and self._holders.get(request_id) is self:
            del self._holders[request_id]

    def release(self) -> None:
        """Idempotent."""
        if self._holders is None:
            return
        for request_id in self._request_ids:
            self._forget(request_id)
        self._holders = None
        self.replica.load -= self.sequences


async def leased(stream: AsyncGenerator[T, None], lease: Lease) -> AsyncGenerator[T, None]:
    """`stream`, with `lease` released once it ends, however it ends."""
    try:
        async for output in stream:
            yield output
    finally:
        try:
            await stream.aclose()  # aborts the request if it is still running
        finally:
            lease.release()  # even if the close was cancelled or failed
