"""The router: several engines behind one frontend, by model and by replica.

What it owns: the routing table (each served model and its replica slots: replicas.py) and
its life (`attach` and `retire` as engines come and go, each model's LoRA adapters), and which
replica holds each request in flight (`request_id -> Lease`, what `abort` reads). The library
fills the table with `open_router` (engine_group.py); the HTTP server's supervisors attach and
restart engines themselves. Every request, the library's and the HTTP server's, goes through a
`Lease` (lease.py): `lease` picks the replica (`ServedModel.pick`) and holds its load, the
lease runs the request there; `Router.generate`, `embed_batch`, `score`, `classify` and
`transcribe` are a lease for one call.

Invariants:
- A request stays on the replica it was first routed to for its whole life (unless that one
  dies before starting it: lease.py); its lease, and the entries `abort` reads, are released
  only when it ends.
- A replica that dies fails only its own requests (its client raises `EngineDeadError`); its
  slot is empty until it is attached again, and no new request is routed to it meanwhile.
- Two models are never served under one name.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from trio_llm.client.engine_client import EngineClient
from trio_llm.client.errors import (
    EngineDeadError,
    EngineStartError,
    LoraError,
    LoraNotFoundError,
    ModelNotServedError,
    NoLiveReplicaError,
)
from trio_llm.client.lease import Lease, leased
from trio_llm.client.lora import LoraRequest, routing_salt
from trio_llm.client.prefix_index import PrefixPolicy, PrefixRecord, block_keys
from trio_llm.client.replicas import Replica, ReplicaStats, ServedModel

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
        return Lease(self._holders, self.policy, model, replica, sequences)

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
        return leased(stream, lease)

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
        return leased(stream, lease)

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
