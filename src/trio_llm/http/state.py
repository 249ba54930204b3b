"""What the routes of one app share: its config, metrics and admission, and the engine it serves.

Invariants:
- A handler gets its engine only from `engine_for` (or `require_engine`), which refuses with the
  one 503 (`engine_unavailable`) while no live engine is attached, and with a 404 when the
  request names another model. That call is where a request will be routed once the server
  serves several models; nothing else looks at `engine`.
- `model` outlives its engine (the supervisor attaches None when the engine dies), so
  /v1/models still answers while a dead engine restarts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from quart import current_app

from trio_llm import __version__
from trio_llm.engine.loader import read_generation_config
from trio_llm.http.admission import Admission
from trio_llm.http.config import ServerConfig
from trio_llm.http.errors import engine_unavailable
from trio_llm.http.metrics import Metrics
from trio_llm.http.plans import SamplingDefaults, check_model
from trio_llm.http.responses import now, system_fingerprint

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from trio_llm.client import EngineClient

log = logging.getLogger(__name__)

_EXTENSION = "trio_llm"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    max_model_len: int
    vocab_size: int
    created: int
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    """What requests that leave sampling fields unset get (`--generation-config`)."""
    fingerprint: str | None = None
    """`system_fingerprint` of every response."""


@dataclass
class AppState:
    """What the routes share: the config, the current engine (None while it is down)."""

    config: ServerConfig
    metrics: Metrics = field(init=False)
    admission: Admission = field(init=False)
    engine: EngineClient | None = None
    model: ModelInfo | None = None
    engine_failed: trio.Event = field(default_factory=trio.Event)
    """Set when the supervisor gives up; `trio-llm serve` then exits non-zero."""

    def __post_init__(self) -> None:
        self.metrics = Metrics(self._engine_stats, lambda: self.model and self.model.name)
        self.admission = Admission(self.config.capacity)

    def _engine_stats(self) -> Any | None:
        engine = self.engine
        return engine.stats() if engine is not None and engine.is_alive else None

    def attach(self, engine: EngineClient | None) -> None:
        """Called by the supervisor (or build_app) when an engine comes up or goes down."""
        self.engine = engine
        if engine is not None:
            mc = engine.model_config
            self.model = ModelInfo(
                mc.model,
                mc.max_model_len,
                mc.vocab_size,
                now(),
                self._sampling_defaults(engine),
                system_fingerprint(mc.model, mc.dtype, __version__),
            )

    def _sampling_defaults(self, engine: EngineClient) -> SamplingDefaults:
        """The defaults `--generation-config` says, logged each time an engine comes up."""
        setting = self.config.generation_config
        if setting in ("none", "vllm"):
            log.info("sampling defaults: OpenAI's (--generation-config %s)", setting)
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
                "sampling defaults from %s for requests that do not set them: %s "
                "(--generation-config none turns them off)",
                source,
                given,
            )
        else:
            log.info("sampling defaults: OpenAI's (%s recommends none)", source)
        return defaults

    def require_engine(self) -> tuple[EngineClient, ModelInfo]:
        engine, model = self.engine, self.model
        if engine is None or model is None or not engine.is_alive:
            raise engine_unavailable()
        return engine, model

    def engine_for(self, requested_model: str | None) -> tuple[EngineClient, ModelInfo]:
        """The engine serving `requested_model` (None: the default one)."""
        engine, model = self.require_engine()
        check_model(requested_model, model.name)
        return engine, model

    def require_model(self) -> ModelInfo:
        """The served model's card, known from the first time its engine came up."""
        if self.model is None:
            raise engine_unavailable()
        return self.model


def install_state(app: QuartTrio, state: AppState) -> None:
    app.extensions[_EXTENSION] = state


def app_state(app: QuartTrio) -> AppState:
    return app.extensions[_EXTENSION]


def current_state() -> AppState:
    """The state of the app handling the current request."""
    return app_state(current_app)  # type: ignore[arg-type]
