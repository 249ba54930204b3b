"""Prometheus metrics of one app: the engine's state, request latencies, tokens, HTTP traffic.

Each app has its own `CollectorRegistry` (never the process-global one), so several apps in
one process (tests, embedding) do not collide. Engine gauges are read from every engine's
`EngineClient.stats()` at scrape time, so they are never stale and cost nothing between
scrapes: summed over all engines under the plain names, and per replica with `model` and
`replica` labels. Everything else is counted as requests pass through the HTTP layer, once per
served model (`ModelMetrics`), and exposed summed over the models under the plain names.

The names dashboards, autoscalers and gateways read from vLLM (`vllm:num_requests_running`,
`vllm:time_to_first_token_seconds`, ...) are exposed next to the project's own, each model's
figures under vLLM's `model_name` label with its own served name. They are the same samples
renamed at scrape time (`_vllm_names`), so every value is counted once and the two spellings
cannot disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client.replicas import ReplicaStats

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip


_ENGINE_GAUGES = (
    ("num_requests_running", "Sequences the engine is running", "num_running"),
    ("num_requests_waiting", "Sequences waiting to be scheduled", "num_waiting"),
    (
        "num_requests_in_flight",
        "Requests the frontend has sent and not yet seen finish",
        "num_requests_in_flight",
    ),
    ("kv_cache_usage_perc", "Fraction of KV cache blocks in use", "kv_usage"),
    ("kv_cache_free_blocks", "KV cache blocks free", "num_free_blocks"),
    ("kv_cache_total_blocks", "KV cache blocks in all", "num_total_blocks"),
    ("num_steps", "Engine steps run (a speech engine's: 30-second windows)", "num_steps"),
)


class _EngineCollector(Collector):
    """Engine gauges, read from the live engines at scrape time: summed over every engine
    (unlabelled, as with one engine), per replica (`trio_llm_replica_*`, labelled with `model`
    and `replica`), and per model under vLLM's names. A replica that is down has only
    `trio_llm_replica_alive 0`."""

    def __init__(
        self,
        replicas: Callable[[], Sequence[ReplicaStats]],
        aggregate: Callable[[Sequence[Any]], Any],
    ) -> None:
        self._replicas = replicas
        self._aggregate = aggregate

    def collect(self) -> Iterator[Metric]:
        replicas = self._replicas()
        live = [r.stats for r in replicas if r.stats is not None]
        yield GaugeMetricFamily(
            "trio_llm_engine_alive",
            "1 while every engine process is alive",
            value=int(bool(replicas) and len(live) == len(replicas)),
        )
        yield GaugeMetricFamily("trio_llm_engines_alive", "Engine processes alive", value=len(live))
        yield from self._per_replica(replicas)
        if not live:
            return
        yield from _engine_families([], [([], self._aggregate(live))])
        by_model: dict[str, list[Any]] = {}
        for r in replicas:
            if r.stats is not None:
                by_model.setdefault(r.model, []).append(r.stats)
        per_model = [([model], self._aggregate(stats)) for model, stats in by_model.items()]
        for family in _engine_families(["model"], per_model):
            yield from _vllm_names(family)
        yield from _vllm_info(by_model)

    def _per_replica(self, replicas: Sequence[ReplicaStats]) -> Iterator[Metric]:
        labels = ["model", "replica"]
        alive = GaugeMetricFamily(
            "trio_llm_replica_alive", "1 while this engine process is alive", labels=labels
        )
        load = GaugeMetricFamily(
            "trio_llm_replica_load",
            "Sequences the router has sent to this replica and not seen finish",
            labels=labels,
        )
        restarts = CounterMetricFamily(
            "trio_llm_replica_restarts", "Times this replica was restarted", labels=labels
        )
        gauges = [
            (GaugeMetricFamily(f"trio_llm_replica_{name}", doc, labels=labels), attr)
            for name, doc, attr in _ENGINE_GAUGES
        ]
        for r in replicas:
            key = [r.model, str(r.replica)]
            alive.add_metric(key, int(r.stats is not None))
            load.add_metric(key, r.load)
            restarts.add_metric(key, r.restarts)
            if r.stats is not None:
                for family, attr in gauges:
                    family.add_metric(key, getattr(r.stats, attr))
        yield alive
        yield load
        yield restarts
        for family, _ in gauges:
            yield family


def _vllm_info(by_model: dict[str, list[Any]]) -> Iterator[Metric]:
    """vLLM's info gauges, which llm-d's endpoint picker reads, with vLLM's labels exactly:
    `vllm:cache_config_info` (1, labelled with one engine's `block_size` and `num_gpu_blocks`)
    and, when LoRA is enabled, `vllm:lora_requests_info` (the current time, labelled with
    `max_lora` and the comma-joined adapters of the running and the waiting requests; vLLM
    sets it each step, the picker reads the latest). `by_model`: each model's live engines'
    stats; a vLLM process is one engine, so the blocks are one engine's, not a model's sum."""
    config = GaugeMetricFamily(
        "vllm:cache_config_info",
        "Information of the engine's KV cache config",
        labels=["block_size", "num_gpu_blocks"],
    )
    seen = set()
    for engines in by_model.values():
        key = (str(engines[0].block_size), str(engines[0].num_total_blocks))
        if key not in seen:  # several models with one config: one sample
            seen.add(key)
            config.add_metric(list(key), 1.0)
    yield config
    with_lora = [s for engines in by_model.values() for s in engines if s.max_loras]
    if not with_lora:
        return
    lora = GaugeMetricFamily(
        "vllm:lora_requests_info",
        "Running stats on LoRA requests",
        labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
    )
    running = dict.fromkeys(n for s in with_lora for n in s.running_loras)
    waiting = dict.fromkeys(n for s in with_lora for n in s.waiting_loras)
    max_lora = str(max(s.max_loras for s in with_lora))
    lora.add_metric([max_lora, ",".join(running), ",".join(waiting)], time.time())
    yield lora


def _engine_families(labels: list[str], figures: list[tuple[list[str], Any]]) -> Iterator[Metric]:
    """The engine gauges and counters of each (label values, engine stats) in `figures`."""
    families: list[tuple[Metric, Callable[[Any], float]]] = [
        (GaugeMetricFamily(f"trio_llm_{name}", doc, labels=labels), attrgetter(attr))
        for name, doc, attr in _ENGINE_GAUGES
    ]
    families += [
        (
            CounterMetricFamily(
                "trio_llm_prefix_cache_queries",
                "Prompt tokens looked up in the prefix cache",
                labels=labels,
            ),
            attrgetter("prefix_cache_queries"),
        ),
        (
            CounterMetricFamily(
                "trio_llm_prefix_cache_hits",
                "Prompt tokens found in the prefix cache",
                labels=labels,
            ),
            attrgetter("prefix_cache_hits"),
        ),
        (
            GaugeMetricFamily(
                "trio_llm_prefix_cache_hit_rate",
                "Prefix cache hits over queries since the engines started",
                labels=labels,
            ),
            lambda s: (
                s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
            ),
        ),
        (
            CounterMetricFamily(
                "trio_llm_num_preemptions",
                "Sequences preempted: for lack of KV blocks, or for a more urgent request",
                labels=labels,
            ),
            attrgetter("num_preemptions"),
        ),
    ]
    for family, value in families:
        for key, stats in figures:
            family.add_metric(key, value(stats))  # type: ignore[attr-defined]
        yield family


_VLLM_NAMES: dict[str, tuple[str, ...]] = {
    "trio_llm_num_requests_running": ("vllm:num_requests_running",),
    "trio_llm_num_requests_waiting": ("vllm:num_requests_waiting",),
    "trio_llm_kv_cache_usage_perc": ("vllm:kv_cache_usage_perc",),
    "trio_llm_prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "trio_llm_prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "trio_llm_num_preemptions": ("vllm:num_preemptions",),
    "trio_llm_prompt_tokens": ("vllm:prompt_tokens",),
    "trio_llm_generation_tokens": ("vllm:generation_tokens",),
    "trio_llm_request_success": ("vllm:request_success",),
    "trio_llm_time_to_first_token_seconds": ("vllm:time_to_first_token_seconds",),
    # vLLM renamed time_per_output_token to inter_token_latency; dashboards read either.
    "trio_llm_inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "trio_llm_e2e_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
}
"""The project's metric families and the vLLM names they are also exposed under."""


def _vllm_names(family: Metric) -> Iterator[Metric]:
    """A per-model family (labelled `model`) under its vLLM names, if it has any, the label
    spelt `model_name` as vLLM spells it."""
    for alias in _VLLM_NAMES.get(family.name, ()):
        renamed = Metric(alias, family.documentation, family.type)
        for sample in family.samples:
            labels = {("model_name" if k == "model" else k): v for k, v in sample.labels.items()}
            renamed.add_sample(
                alias + sample.name[len(family.name) :],
                labels,
                sample.value,
                sample.timestamp,
                sample.exemplar,
            )
        yield renamed


def _summed(family: Metric) -> Metric:
    """A per-model family with the `model` label summed away: the figure over every model
    (`_created`, a time, is the earliest)."""
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in family.samples:
        key = (sample.name, tuple((k, v) for k, v in sample.labels.items() if k != "model"))
        if sample.name.endswith("_created"):
            totals[key] = min(totals.get(key, sample.value), sample.value)
        else:
            totals[key] = totals.get(key, 0.0) + sample.value
    summed = Metric(family.name, family.documentation, family.type)
    for (name, labels), value in totals.items():
        summed.add_sample(name, dict(labels), value)
    return summed


class _PerModel(Collector):
    """The families counted per model (label `model`): summed over the models under the
    project's names, and each model's own under vLLM's."""

    def __init__(self, families: list[Counter | Histogram]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        for source in self._families:
            for family in source.collect():
                yield _summed(family)
                yield from _vllm_names(family)


class Metrics:
    def __init__(
        self,
        replicas: Callable[[], Sequence[ReplicaStats]],
        aggregate: Callable[[Sequence[Any]], Any],
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "trio_llm_http_requests",
            "HTTP requests by route and status",
            ["method", "route", "status"],
            registry=r,
        )
        self.rejected = Counter(
            "trio_llm_requests_rejected", "Requests refused with 503 (queue full)", registry=r
        )
        self.embedding_inputs = Counter(
            "trio_llm_embedding_inputs",
            "Inputs embedded (each counts its tokens as prompt tokens)",
            registry=r,
        )
        self.audio_seconds = Counter(
            "trio_llm_audio_seconds",
            "Seconds of audio sent for transcription or translation",
            ["model"],
            registry=r,
        )
        # Counted per model (ModelMetrics), exposed through _PerModel, not registered alone.
        model = ["model"]
        self.prompt_tokens = Counter(
            "trio_llm_prompt_tokens", "Prompt tokens", model, registry=None
        )
        self.generation_tokens = Counter(
            "trio_llm_generation_tokens", "Generated tokens", model, registry=None
        )
        self.finished = Counter(
            "trio_llm_request_success",
            "Finished sequences by finish reason",
            [*model, "finished_reason"],
            registry=None,
        )
        self.ttft = Histogram(
            "trio_llm_time_to_first_token_seconds",
            "Arrival to first token",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )
        self.itl = Histogram(
            "trio_llm_inter_token_latency_seconds",
            "Gap between tokens (mean over each delivered batch of tokens)",
            model,
            buckets=_ITL_BUCKETS,
            registry=None,
        )
        self.e2e = Histogram(
            "trio_llm_e2e_request_latency_seconds",
            "Arrival to finish",
            model,
            buckets=_LATENCY_BUCKETS,
            registry=None,
        )
        r.register(_EngineCollector(replicas, aggregate))
        per_model = [self.prompt_tokens, self.generation_tokens, self.finished]
        r.register(_PerModel([*per_model, self.ttft, self.itl, self.e2e]))
        self._models: dict[str, ModelMetrics] = {}

    def for_model(self, name: str) -> ModelMetrics:
        """The figures of requests to the model served as `name` (its counters exist, at
        zero, from the first call on)."""
        model = self._models.get(name)
        if model is None:
            model = self._models[name] = ModelMetrics(self, name)
        return model

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class ModelMetrics:
    """One served model's children of the per-model families."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self.prompt_tokens = metrics.prompt_tokens.labels(name)
        self.generation_tokens = metrics.generation_tokens.labels(name)
        self.finished = partial(metrics.finished.labels, name)
        """The counter of sequences of this model that finished for a reason (its argument)."""
        self.ttft = metrics.ttft.labels(name)
        self.itl = metrics.itl.labels(name)
        self.e2e = metrics.e2e.labels(name)

    def recorder(self) -> RequestRecorder:
        return RequestRecorder(self)


class RequestRecorder:
    """Feeds one engine request's outputs (DELTA or FINAL_ONLY) into the metrics."""

    def __init__(self, metrics: ModelMetrics) -> None:
        self._m = metrics
        self._seen = False
        self._last_token_time: float | None = None

    def record(self, output: RequestOutput) -> None:
        m, t = self._m, output.metrics
        new = max((len(o.token_ids) for o in output.outputs), default=0)
        self._m.generation_tokens.inc(sum(len(o.token_ids) for o in output.outputs))
        if not self._seen:
            self._seen = True
            m.prompt_tokens.inc(len(output.prompt_token_ids))
            if t.first_token_time is not None:
                m.ttft.observe(max(0.0, t.first_token_time - t.arrival_time))
                if new > 1 and t.last_token_time is not None:
                    m.itl.observe(max(0.0, t.last_token_time - t.first_token_time) / (new - 1))
        elif new and t.last_token_time is not None and self._last_token_time is not None:
            m.itl.observe(max(0.0, t.last_token_time - self._last_token_time) / new)
        self._last_token_time = t.last_token_time
        for o in output.outputs:
            if o.finish_reason is not None:
                m.finished(o.finish_reason).inc()
        if output.finished and t.finished_time is not None:
            m.e2e.observe(max(0.0, t.finished_time - t.arrival_time))
