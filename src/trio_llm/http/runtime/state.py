"""What the routes of one app share: its config, metrics and admission, and the engines it
serves, behind one `Router` (client/router.py): each model, each with its replicas.

Invariants:
- A handler gets its engine only from `lease`, which routes by the request's `model`
  (404 naming the served models when none has that name, 400 naming which models serve which
  endpoint when the model does not serve this one) to a live replica (503,
  `engine_unavailable`, while none is up): the one holding the longest cached prefix of the
  request's prompt unless load says otherwise, else the least loaded (client/prefix_index.py),
  and holds that replica for the request's sequences until the request ends, so the next
  request sees the load.
- Admission is per model: a model admits `replica_capacity` sequences per live replica
  (ServerConfig), so one model's overload never refuses another's requests, and a model that
  lost a replica admits less.
- A replica whose supervisor gave up is retired (out of rotation, /health degraded); the server
  stops only when every replica of some model is retired.
- A model's card outlives its engines (a replica's slot is emptied while it restarts), so
  /v1/models still answers while a dead engine restarts.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio
from quart import current_app

from trio_llm import __version__
from trio_llm.client.errors import ModelNotServedError, NoLiveReplicaError
from trio_llm.client.lease import Lease
from trio_llm.client.prefix_index import PrefixPolicy
from trio_llm.client.replicas import ServedModel, aggregate
from trio_llm.client.router import Router
from trio_llm.config import EngineArgs
from trio_llm.http.config import ServerConfig
from trio_llm.http.errors import ProtocolError, bad_request, engine_unavailable
from trio_llm.http.ids import now, system_fingerprint
from trio_llm.http.responses.store import ResponseStore, open_response_store
from trio_llm.http.runtime.admission import Admission
from trio_llm.http.runtime.metrics import Metrics
from trio_llm.http.runtime.middleware import on_request_end
from trio_llm.http.sampling import SamplingDefaults
from trio_llm.model_files import read_generation_config
from trio_llm.tasks import TASK_WORDS, USE_WORDS, serves

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from trio_llm.client import EngineClient

log = logging.getLogger(__name__)

_EXTENSION = "trio_llm"

USE_ENDPOINTS = {
    "generate": "/v1/chat/completions, /v1/completions and /v1/responses",
    "embed": "/v1/embeddings",
    "score": "/score and /rerank",
    "classify": "/classify",
    "pooling": "/pooling",
    "transcribe": "/v1/audio/transcriptions and /v1/audio/translations",
}
"""Where each use of a model (`trio_llm.tasks`) is served, for the 400 of a model that does
not serve the endpoint asked."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_model_len: int
    vocab_size: int
    created: int
    task: str = "generate"
    embedding_size: int = 0
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    """What requests that leave sampling fields unset get (`--generation-config`)."""
    fingerprint: str | None = None
    """`system_fingerprint` of every response."""
    unproducible_bytes: frozenset[int] = frozenset()
    """The bytes no token of the model writes: a constraint that forces one is refused."""
    input_modalities: tuple[str, ...] = ("text",)
    """What a request may hold: text, and images for a vision-language model."""


@dataclass
class AppState:
    """What the routes share: the config, and the router over every engine."""

    config: ServerConfig
    router: Router = field(init=False)
    metrics: Metrics = field(init=False)
    admissions: list[Admission] = field(init=False)
    """One per served model, in order."""
    responses: ResponseStore = field(init=False)
    """The Responses API's stored responses (--responses-store-size)."""
    engine_failed: trio.Event = field(default_factory=trio.Event)
    """Set when a supervisor gives up; `trio-llm serve` then exits non-zero."""
    _cards: dict[int, ModelInfo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.router = Router.with_replicas([s.replicas for s in self.config.model_specs])
        self.router.policy = PrefixPolicy(enabled=self.config.prefix_routing)
        self.metrics = Metrics(self.router.stats, aggregate)
        self.admissions = [Admission(0) for _ in self.config.model_specs]
        self.responses = open_response_store(
            self.config.responses_store,
            self.config.responses_store_size,
            self.config.responses_store_ttl,
        )

    def attach(self, group: int, replica: int, engine: EngineClient | None) -> None:
        """Called by the supervisors (or build_app) as an engine comes up or goes down."""
        self.router.attach(group, replica, engine)
        if engine is not None and group not in self._cards:
            mc = engine.model_config
            self._cards[group] = ModelInfo(
                mc.model,
                mc.max_model_len,
                mc.vocab_size,
                now(),
                mc.task,
                mc.embedding_size,
                self._sampling_defaults(engine) if mc.task == "generate" else SamplingDefaults(),
                system_fingerprint(mc.model, mc.dtype, __version__),
                engine.unproducible_bytes,
                ("text", "image") if engine.images is not None else ("text",),
            )
            self.metrics.for_model(mc.model)  # its figures exist, at zero, from now on

    def _sampling_defaults(self, engine: EngineClient) -> SamplingDefaults:
        """The defaults `--generation-config` says for this engine's model (with `auto`, its
        own generation_config.json), logged when the model first comes up."""
        name = engine.model_config.model
        setting = self.config.generation_config
        if setting in ("none", "vllm"):
            log.info("%s: sampling defaults: OpenAI's (--generation-config %s)", name, setting)
            return SamplingDefaults()
        if setting == "auto":
            source, config = "the model's generation_config.json", engine.generation_config
        else:
            source, config = (
                f"{setting}/generation_config.json",
                read_generation_config(Path(setting)),
            )
        defaults = SamplingDefaults.from_generation_config(config)
        if overrides := defaults.overrides():
            given = ", ".join(f"{k}={v}" for k, v in overrides.items())
            log.info(
                "%s: sampling defaults from %s for requests that do not set them: %s "
                "(--generation-config none turns them off)",
                name,
                source,
                given,
            )
        else:
            log.info("%s: sampling defaults: OpenAI's (%s recommends none)", name, source)
        return defaults

    # -- what handlers ask --------------------------------------------------------------

    def admit(self, served: ServedModel, sequences: int) -> None:
        """Count `sequences` against `served`'s capacity until the request ends, or 503."""
        group = self.router.models.index(served)
        admission = self.admissions[group]
        spec = self.config.model_specs[group]
        admission.capacity = len(served.live()) * self.config.replica_capacity(spec)
        try:
            ticket = admission.admit_nowait(sequences)
        except ProtocolError:
            self.metrics.rejected.inc()
            raise
        on_request_end(ticket.release)

    def lease(
        self,
        requested_model: str | None,
        *,
        task: str | None = "generate",
        sequences: int = 0,
        prompt: Sequence[int] = (),
        cache_salt: str | None = None,
    ) -> tuple[Lease, ModelInfo]:
        """A live replica serving `requested_model` (None: the first model) for `task`, a use
        of `trio_llm.tasks` (None: whatever it serves), chosen for `prompt` (its token ids,
        when known: cache-aware) and held for `sequences` until the request ends: the request
        generates (embeds, scores) through the lease, so `Router.abort` sees it."""
        served, info = self.model_for(requested_model, task=task)
        try:
            lease = self.router.lease(served, sequences, prompt=prompt, cache_salt=cache_salt)
        except NoLiveReplicaError:
            raise engine_unavailable() from None
        on_request_end(lease.release)
        return lease, info

    def engine_for(self, served: ServedModel) -> EngineClient:
        """A live replica's engine, for what needs only the model's tokenizer (every replica
        has the same); 503 while none is up."""
        live = served.live()
        if not live or live[0].client is None:
            raise engine_unavailable()
        return live[0].client

    def retire(self, group: int, replica: int) -> None:
        """A replica's supervisor gave up: out of rotation for good; the server fails (and
        `trio-llm serve` exits) once a model has no replica left that may come back."""
        if self.router.retire(group, replica):
            self.engine_failed.set()

    def model_for(
        self, requested_model: str | None, *, task: str | None
    ) -> tuple[ServedModel, ModelInfo]:
        """The served model and its card, or the 404 / 400 that says which models there are."""
        try:
            served = self.router.model(requested_model)
        except ModelNotServedError as error:
            raise ProtocolError(404, str(error), param="model", code="model_not_found") from None
        info = self._cards.get(self.router.models.index(served))
        if info is None:
            raise engine_unavailable()
        if task is not None and not serves(info.task, task):
            raise bad_request(self._wrong_task(info, task), param="model", code="wrong_model_task")
        return served, info

    def first_served(self, task: str) -> str | None:
        """The name of the first model served for `task` (what a request that names no model
        gets, on the routes of a task other than the first model's)."""
        return next((c.name for c in self.cards() if c.task == task), None)

    def cards(self) -> list[ModelInfo]:
        """Every served model's card, in order (those that came up at least once)."""
        return [self._cards[g] for g in sorted(self._cards)]

    def lora_cards(self) -> list[tuple[ModelInfo, str, str]]:
        """Every LoRA adapter served: (its base model's card, its name, its directory)."""
        return [
            (self._cards[g], name, path)
            for g, model in enumerate(self.router.models)
            if g in self._cards
            for name, path in model.loras.items()
        ]

    def lora_base(self, requested: str | None) -> str:
        """The served model a LoRA adapter is to be loaded on: `requested` (404 if it is not
        served), or the first with LoRA enabled; 400 when LoRA is not enabled there."""
        specs = self.config.model_specs
        names = self.router.names()
        if requested is not None:
            if requested not in names:
                raise ProtocolError(
                    404,
                    f"The model `{requested}` does not exist; this server serves "
                    + ", ".join(f"`{n}`" for n in names),
                    param="base_model_name",
                    code="model_not_found",
                )
            group = next(g for g, m in enumerate(self.router.models) if m.name == requested)
            if not specs[group].args.lora:
                raise bad_request(
                    f"LoRA is not enabled on `{requested}` (--enable-lora)",
                    param="base_model_name",
                )
            return requested
        for group, spec in enumerate(specs):
            card = self._cards.get(group)
            if spec.args.lora and card is not None and card.task == "generate":
                return card.name
        raise bad_request(
            "LoRA is not enabled on any model this server generates with (--enable-lora)",
            param="base_model_name",
        )

    def engine_args(self, group: int, args: EngineArgs) -> EngineArgs:
        """What replica `group`'s engine (re)starts with: `args`, with the LoRA adapters its
        model serves by now (loaded or unloaded at run time since the start)."""
        model = self.router.models[group]
        if model.config is None or not args.lora:
            return args
        return msgspec.structs.replace(args, lora_modules=dict(model.loras))

    def card(self, name: str) -> ModelInfo:
        for info in self.cards():
            if info.name == name:
                return info
        raise ProtocolError(
            404,
            f"The model `{name}` does not exist; this server serves "
            + ", ".join(f"`{c.name}`" for c in self.cards()),
            param="model",
            code="model_not_found",
        )

    def health(self) -> dict[str, object]:
        """Every replica's state; 'ok' when all run, 'degraded' when each model still has one
        that runs, 'unavailable' when some model has none (the one case /health answers 503)."""
        engines = [
            {
                "model": m.name,
                "replica": r.index,
                "alive": r.is_alive,
                "pid": r.client.pid if r.client is not None else None,
                "restarts": r.restarts,
                "retired": r.retired,
            }
            for m, r in self.router.replicas()
        ]
        if self.router.all_alive:
            status = "ok"
        elif all(m.live() for m in self.router.models):
            status = "degraded"
        else:
            status = "unavailable"
        return {"status": status, "engines": engines}

    def _wrong_task(self, info: ModelInfo, use: str) -> str:
        """Which served models serve which endpoint, `use`'s first (or that none does)."""
        uses = sorted(USE_ENDPOINTS, key=lambda u: u != use)
        serving = "; ".join(
            f"{USE_ENDPOINTS[u]}: "
            + ", ".join(f"`{c.name}`" for c in self.cards() if serves(c.task, u))
            for u in uses
            if any(serves(c.task, u) for c in self.cards())
        )
        if not any(serves(c.task, use) for c in self.cards()):
            serving = f"{serving}; no model here serves {USE_WORDS[use]}"
        return (
            f"The model `{info.name}` serves {TASK_WORDS[info.task]}, not {USE_WORDS[use]}; "
            f"this server serves {serving}"
        )


def install_state(app: QuartTrio, state: AppState) -> None:
    app.extensions[_EXTENSION] = state


def app_state(app: QuartTrio) -> AppState:
    return app.extensions[_EXTENSION]


def current_state() -> AppState:
    """The state of the app handling the current request."""
    return app_state(current_app)  # type: ignore[arg-type]
