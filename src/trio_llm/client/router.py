"""The router: several engines behind one frontend, by model and by replica.

What it owns: the routing table (each served model and its replica slots, each slot holding the
replica's live `EngineClient` or None while it is down), each replica's load, and which replica
holds each request. Every request, the library's and the HTTP server's, goes through a `Lease`:
`lease` picks the replica and holds its load, the lease's `generate`/`embed_batch` run the
request there and record which replica holds it (what `abort` reads); `Router.generate` and
`Router.embed_batch` are a lease for one call. `open_router` starts every engine of a table at
once (for the library; the HTTP server's supervisor attaches and restarts them itself).

A new request goes to its model's live replica with the least load, ties broken round-robin.
The load is what the frontend has routed there and not yet seen finish: the sequences a lease
holds (n choices of each prompt, or each embedding input) from the moment the replica is
picked, so a burst of requests spreads at once, before any engine has stepped; it is the
replica's running plus waiting sequences, plus those on their way.

Invariants:
- A request stays on the replica it was first routed to for its whole life: its lease, and the
  `request_id -> replica` entries `abort` reads, are released only when it ends.
- A replica that dies fails only its own requests (its client raises `EngineDeadError`); its
  slot is empty until it is attached again, and no new request is routed to it meanwhile.
- Every lease is released exactly once, so a replica's load never leaks.

Why a little over 400 lines: the routing table, the lease and `open_router` (the library's way
to fill the table) are one concept seen from three sides.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from trio_llm.client.engine_client import EngineClient, EngineStats, ModelConfig
from trio_llm.client.engine_process import log_stage, open_engine
from trio_llm.client.errors import (
    EngineDeadError,
    EngineStartError,
    LoraError,
    LoraNotFoundError,
    start_error_in,
)
from trio_llm.client.lora import LoraRequest, routing_salt
from trio_llm.client.prefix_index import PrefixPolicy, PrefixRecord, block_keys
from trio_llm.config import EngineArgs

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


class ModelNotServedError(LookupError):
    """No served model has that name; the message lists those that are."""


class NoLiveReplicaError(EngineDeadError):
    """Every replica of the model is down (dead or restarting)."""


@dataclass(eq=False)
class Replica:
    group: int
    index: int
    client: EngineClient | None = None
    load: int = 0
    """Sequences leased here and not yet released."""
    started: bool = False
    """A client was attached once."""
    restarts: int = 0
    """Times a client was attached after the first."""
    retired: bool = False
    """Its supervisor gave up restarting it: it stays out of rotation for good."""
    record: PrefixRecord = field(default_factory=lambda: PrefixRecord(0))
    """The prompt blocks routed here (cache-aware routing), sized to its KV cache once up."""

    @property
    def is_alive(self) -> bool:
        return self.client is not None and self.client.is_alive

    @property
    def label(self) -> str:
        return str(self.index)


@dataclass(eq=False)
class ServedModel:
    """One model and its replicas; `config` is known once a replica first came up."""

    replicas: list[Replica]
    config: ModelConfig | None = None
    loras: dict[str, str] = field(default_factory=dict)
    """The LoRA adapters every replica serves (name -> PEFT directory): those it started with,
    then as `Router.load_lora` / `unload_lora` change them."""
    _cursor: int = 0

    @property
    def name(self) -> str | None:
        return None if self.config is None else self.config.model

    @property
    def task(self) -> str:
        return "generate" if self.config is None else self.config.task

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.is_alive]

    def pick(
        self,
        keys: Sequence[int],
        policy: PrefixPolicy,
        exclude: Replica | None = None,
    ) -> Replica | None:
        """The live replica for a prompt whose block keys are `keys`: the one holding its
        longest prefix, unless load says otherwise (`PrefixPolicy`), else the least loaded,
        ties taken in round-robin order. `exclude`: a replica not to pick (a retry's)."""
        count = len(self.replicas)
        order = [self.replicas[(self._cursor + step) % count] for step in range(count)]
        live = [r for r in order if r.is_alive and r is not exclude]
        if not live:
            return None
        chosen = policy.choose(
            [r.load for r in live], [r.record.match(keys) for r in live], len(keys)
        )
        best = live[chosen] if chosen is not None else min(live, key=lambda r: r.load)
        self._cursor = (best.index + 1) % count
        if keys:
            best.record.insert(keys)
        return best


class Lease:
    """A request's hold on its replica: `sequences` of its load until `release()`, and the
    requests it runs there (`generate`, `embed_batch`, `score`, `classify`,
    `transcribe`), which `Router.abort` finds by id until then. `client` is the replica's engine,
    for what is not a request (tokenizing).

    A request whose replica dies before the engine started it (it was still waiting there:
    `EngineDeadError.started` is False) is moved: the lease takes another live replica of the
    model and sends the request again, once per replica at most; one that had started fails
    with the engine's error."""

    __slots__ = ("_model", "_request_ids", "_router", "client", "replica", "sequences")

    def __init__(
        self, router: Router, model: ServedModel, replica: Replica, sequences: int
    ) -> None:
        assert replica.client is not None
        self._router: Router | None = router
        self._model = model
        self.replica = replica
        self.client: EngineClient = replica.client
        self.sequences = sequences
        self._request_ids: list[str] = []
        replica.load += sequences

    def generate(
        self,
        prompt: str | list[int],
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
        prompt: str | list[int],
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
        prompt: str | list[int],
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
        router = self._router
        if router is None:
            return False
        if self.replica.is_alive and id(self.replica) not in tried:
            tried.add(id(self.replica))  # another request of this lease moved it already
            return True
        replica = self._model.pick((), router.policy, exclude=self.replica)
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
        router = self._router
        if router is None:
            raise RuntimeError("this lease was released")
        request_id = request_id or uuid.uuid4().hex
        if request_id in router._holders:
            raise ValueError(f"request id {request_id!r} is already in flight")
        router._holders[request_id] = self
        self._request_ids.append(request_id)
        return request_id

    def _forget(self, request_id: str) -> None:
        if self._router is not None and self._router._holders.get(request_id) is self:
            del self._router._holders[request_id]

    def release(self) -> None:
        """Idempotent."""
        if self._router is None:
            return
        for request_id in self._request_ids:
            self._forget(request_id)
        self._router = None
        self.replica.load -= self.sequences


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    model: str
    replica: int
    stats: EngineStats | None
    """None while the replica is down."""
    load: int
    restarts: int = 0


@dataclass
class Router:
    """Routes requests to the least-loaded live replica of their model.

    Made with the number of replicas of each model, in order (the first model is the default);
    replica slots are filled with `attach` as engines come up and emptied as they go."""

    models: list[ServedModel] = field(default_factory=list)
    policy: PrefixPolicy = field(default_factory=PrefixPolicy)
    """When a replica's cached prefix outweighs load (`prefix_index.py`)."""
    _holders: dict[str, Lease] = field(default_factory=dict)

    @classmethod
    def with_replicas(cls, counts: Sequence[int]) -> Router:
        return cls([ServedModel([Replica(g, i) for i in range(n)]) for g, n in enumerate(counts)])

    @classmethod
    def of(cls, *clients: EngineClient) -> Router:
        """A table of already running engines, one model each (their served names)."""
        router = cls.with_replicas([1] * len(clients))
        for group, client in enumerate(clients):
            router.attach(group, 0, client)
        return router

    # -- the table -----------------------------------------------------------------------

    def attach(self, group: int, index: int, client: EngineClient | None) -> None:
        """Put a replica's client in its slot (None: it is down)."""
        model = self.models[group]
        replica = model.replicas[index]
        if client is not None:
            name = client.model_config.model
            for other in self.models:
                if other is not model and other.name == name:
                    raise EngineStartError(
                        f"two models are served as {name!r}; give one another name"
                    )
            if replica.started:
                replica.restarts += 1
            replica.started = True
            if model.config is None:
                model.config = client.model_config
                model.loras = client.loras
            replica.record = PrefixRecord(client.model_config.num_blocks)
        else:
            replica.record.clear()  # a dead engine's cache died with it
        replica.client = client

    def retire(self, group: int, index: int) -> bool:
        """Take a replica out of rotation for good (its supervisor gave up); True if its model
        has no replica left that may come back."""
        model = self.models[group]
        model.replicas[index].retired = True
        self.attach(group, index, None)
        return all(r.retired for r in model.replicas)

    def model(self, requested: str | None) -> ServedModel:
        """The served model of that name (None: the first); `ModelNotServedError` if none."""
        if requested is None:
            return self.models[0]
        for model in self.models:
            if model.name == requested:
                return model
        for model in self.models:
            if requested in model.loras:
                return model  # a LoRA adapter's requests go to its base model
        loras = [name for m in self.models for name in m.loras]
        raise ModelNotServedError(
            f"The model `{requested}` does not exist; this server serves "
            + ", ".join(f"`{n}`" for n in self.names())
            + (" and the LoRA adapters " + ", ".join(f"`{n}`" for n in loras) if loras else "")
        )

    def names(self) -> list[str]:
        return [m.name for m in self.models if m.name is not None]

    def lora_for(self, requested: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (None: a base model, or no model)."""
        if requested is None or requested in self.names():
            return None
        return requested if any(requested in m.loras for m in self.models) else None

    def replicas(self) -> list[tuple[ServedModel, Replica]]:
        return [(m, r) for m in self.models for r in m.replicas]

    @property
    def all_alive(self) -> bool:
        return all(r.is_alive for _, r in self.replicas())

    # -- routing -------------------------------------------------------------------------

    def lease(
        self,
        model: ServedModel,
        sequences: int,
        *,
        prompt: Sequence[int] = (),
        cache_salt: str | None = None,
    ) -> Lease:
        """Hold a live replica of `model` for `sequences`: the one that holds the longest
        cached prefix of `prompt` (token ids; empty: none known) unless load says otherwise,
        else the least loaded; `NoLiveReplicaError` when it has none."""
        # No prompt (a speech engine's request, whose block size is 0): nothing to look up.
        keys = (
            block_keys(prompt, model.config.block_size, cache_salt)
            if model.config and prompt
            else []
        )
        replica = model.pick(keys, self.policy)
        if replica is None:
            raise NoLiveReplicaError(
                f"no replica of {model.name or 'the model'} is running (restarting); retry later"
            )
        return Lease(self, model, replica, sequences)

    def holder(self, request_id: str) -> Replica | None:
        """The replica a request routed through this router runs on, while it runs."""
        lease = self._holders.get(request_id)
        return None if lease is None else lease.replica

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        model: str | None = None,
        request_id: str | None = None,
        priority: int = 0,
        lora: str | LoraRequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """`EngineClient.generate` on a replica of `model` (`lease` says which), which may name
        a LoRA adapter (then a replica of its base model generates with it)."""
        prompt_ids = () if isinstance(prompt, str) else prompt
        lora = lora or self.lora_for(model)
        lease = self.lease(
            self.model(model),
            params.n,
            prompt=prompt_ids,
            cache_salt=routing_salt(params.cache_salt, lora),
        )
        try:
            stream = lease.generate(
                prompt, params, request_id=request_id, priority=priority, lora=lora
            )
        except BaseException:
            lease.release()
            raise
        return _leased(stream, lease)

    def transcribe(
        self, audio: AudioInput, *, model: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[TranscriptionOutput, None]:
        """`EngineClient.transcribe` on the least-loaded replica of `model`."""
        lease = self.lease(self.model(model), 1)
        try:
            stream = lease.transcribe(audio, **kwargs)
        except BaseException:
            lease.release()
            raise
        return _leased(stream, lease)

    async def embed_batch(
        self,
        prompts: Sequence[str | list[int]],
        *,
        model: str | None = None,
        request_id: str | None = None,
        **kwargs: Any,
    ) -> list[EmbeddingRequestOutput]:
        """`EngineClient.embed_batch` on the least-loaded replica of `model`."""
        lease = self.lease(self.model(model), len(prompts))
        try:
            return await lease.embed_batch(prompts, request_id=request_id, **kwargs)
        finally:
            lease.release()

    async def embed(
        self, prompt: str | list[int], *, model: str | None = None, **kwargs: Any
    ) -> EmbeddingRequestOutput:
        [output] = await self.embed_batch([prompt], model=model, **kwargs)
        return output

    async def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        model: str | None = None,
        request_id: str | None = None,
        **kwargs: Any,
    ) -> list[ScoringRequestOutput]:
        """`EngineClient.score` on the least-loaded replica of `model`."""
        pairs = 1 if isinstance(text_2, str) else len(text_2)
        lease = self.lease(self.model(model), pairs)
        try:
            return await lease.score(text_1, text_2, request_id=request_id, **kwargs)
        finally:
            lease.release()

    async def classify(
        self,
        prompts: Sequence[str | list[int]],
        *,
        model: str | None = None,
        request_id: str | None = None,
        **kwargs: Any,
    ) -> list[ClassificationRequestOutput]:
        """`EngineClient.classify` on the least-loaded replica of `model`."""
        lease = self.lease(self.model(model), len(prompts))
        try:
            return await lease.classify(prompts, request_id=request_id, **kwargs)
        finally:
            lease.release()

    async def abort(self, request_id: str) -> None:
        """Stop a request on the replica that holds it; unknown or finished ids are ignored."""
        replica = self.holder(request_id)
        if replica is not None and replica.client is not None:
            await replica.client.abort(request_id)
        else:
            await anyio.lowlevel.checkpoint()

    async def load_lora(self, name: str, path: str, *, model: str | None = None) -> None:
        """Load the PEFT adapter at `path` on every live replica of `model` (None: the first
        model) and serve it as `name` from then on; `LoraError` with the reason when one
        cannot (those that did unload it again). A replica that restarts later starts with
        `ServedModel.loras`."""
        served = self.model(model)
        if name in self.names() or any(name in m.loras for m in self.models):
            raise LoraError(f"the name {name!r} is served already")
        clients = [r.client for r in served.live() if r.client is not None]
        if not clients:
            raise NoLiveReplicaError(f"no replica of {served.name or 'the model'} is running")
        errors: list[LoraError] = []
        loaded: list[EngineClient] = []

        async def load(client: EngineClient) -> None:
            try:
                await client.load_lora(name, path)
            except LoraError as error:
                errors.append(error)
            else:
                loaded.append(client)

        async with anyio.create_task_group() as tasks:
            for client in clients:
                tasks.start_soon(load, client)
        if errors:
            with anyio.CancelScope(shield=True):
                for client in loaded:
                    await client.unload_lora(name)
            raise errors[0]
        served.loras[name] = path

    async def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name` on every replica of its model (its requests in flight
        finish on it); `LoraNotFoundError` when no model serves it."""
        served = next((m for m in self.models if name in m.loras), None)
        if served is None:
            raise LoraNotFoundError(f"the LoRA adapter {name!r} is not loaded")
        del served.loras[name]  # no new request is routed to it from now on

        async def unload(client: EngineClient) -> None:
            # A replica that died meanwhile restarts without it.
            with contextlib.suppress(LoraNotFoundError, EngineDeadError):
                await client.unload_lora(name)

        async with anyio.create_task_group() as tasks:
            for replica in served.live():
                if replica.client is not None:
                    tasks.start_soon(unload, replica.client)

    def stats(self) -> list[ReplicaStats]:
        """Every replica's figures (None while it is down); `aggregate` sums them."""
        return [
            ReplicaStats(
                m.name or "",
                r.index,
                r.client.stats() if r.client is not None and r.is_alive else None,
                r.load,
                r.restarts,
            )
            for m, r in self.replicas()
        ]


def aggregate(stats: Sequence[EngineStats]) -> EngineStats:
    """Several engines' figures as one: counts and blocks summed, usage over all blocks."""
    total = sum(s.num_total_blocks for s in stats)
    free = sum(s.num_free_blocks for s in stats)
    return EngineStats(
        num_running=sum(s.num_running for s in stats),
        num_waiting=sum(s.num_waiting for s in stats),
        kv_usage=(total - free) / total if total else 0.0,
        num_free_blocks=free,
        num_total_blocks=total,
        prefix_cache_queries=sum(s.prefix_cache_queries for s in stats),
        prefix_cache_hits=sum(s.prefix_cache_hits for s in stats),
        num_preemptions=sum(s.num_preemptions for s in stats),
        num_steps=sum(s.num_steps for s in stats),
        num_requests_in_flight=sum(s.num_requests_in_flight for s in stats),
    )


async def _leased(stream: AsyncGenerator[T, None], lease: Lease) -> AsyncGenerator[T, None]:
    try:
        async for output in stream:
            yield output
    finally:
        try:
            await stream.aclose()  # aborts the request if it is still running
        finally:
            lease.release()  # even if the close was cancelled or failed


@asynccontextmanager
async def open_router(
    *models: str | EngineArgs, data_parallel_size: int = 1, **engine_args: Any
) -> AsyncIterator[Router]:
    """Start `data_parallel_size` engines of each model, all at once, and yield a router over
    them; stop them all on the way out. A model is a name (then `engine_args` apply) or its own
    `EngineArgs`. One engine that fails to start fails the whole call with its
    `EngineStartError`, naming the model. A replica that dies is not restarted here (its
    requests fail; the others go on): the HTTP server's supervisor restarts them."""
    specs = [m if isinstance(m, EngineArgs) else EngineArgs(model=m, **engine_args) for m in models]
    router = Router.with_replicas([data_parallel_size] * len(specs))
    body_error: BaseException | None = None
    try:
        async with anyio.create_task_group() as engines:
            async with anyio.create_task_group() as starters:
                for group, args in enumerate(specs):
                    for index in range(data_parallel_size):
                        starters.start_soon(
                            engines.start, partial(_run_replica, router, group, index, args)
                        )
            try:
                yield router
            except BaseException as exc:
                body_error = exc  # re-raised as itself, not inside an ExceptionGroup
            finally:
                engines.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        start_error = start_error_in(group)
        if start_error is None:
            raise
        raise start_error from None
    if body_error is not None:
        raise body_error


async def _run_replica(
    router: Router,
    group: int,
    index: int,
    args: EngineArgs,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    label = replica_label(args, index)
    try:
        async with open_engine(args, on_stage=log_stage(label)) as client:
            router.attach(group, index, client)
            task_status.started()
            await client.wait_dead()
            router.attach(group, index, None)
            await anyio.sleep_forever()
    except EngineStartError as error:
        traceback = error.engine_traceback
        raise EngineStartError(f"{label}: {error}", engine_traceback=traceback) from None


def replica_label(args: EngineArgs, index: int) -> str:
    """How logs and errors name one engine: `model[replica]`."""
    return f"{args.served_model_name or args.model}[{index}]"
