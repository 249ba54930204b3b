"""Prometheus metrics of one app: the engine's state, request latencies, tokens, HTTP traffic.

Each app has its own `CollectorRegistry` (never the process-global one), so several apps in
one process (tests, embedding) do not collide. Engine gauges are read from
`EngineClient.stats()` at scrape time, so they are never stale and cost nothing between
scrapes; everything else is counted as requests pass through the HTTP layer.

The names dashboards, autoscalers and gateways read from vLLM (`vllm:num_requests_running`,
`vllm:time_to_first_token_seconds`, ...) are exposed next to the project's own, with vLLM's
`model_name` label. They are the same samples renamed at scrape time (`_VllmNames`), so every
value is counted once and the two spellings cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from trio_llm.outputs import RequestOutput

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip


class _EngineCollector(Collector):
    """Engine gauges, read from the live engine at scrape time (nothing while it is down)."""

    def __init__(self, stats: Callable[[], Any | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield GaugeMetricFamily(
            "trio_llm_engine_alive",
            "1 while the engine process is alive",
            value=int(stats is not None),
        )
        if stats is None:
            return
        for name, doc, value in (
            ("num_requests_running", "Sequences the engine is running", stats.num_running),
            ("num_requests_waiting", "Sequences waiting to be scheduled", stats.num_waiting),
            (
                "num_requests_in_flight",
                "Requests the frontend has sent and not yet seen finish",
                stats.num_requests_in_flight,
            ),
            ("kv_cache_usage_perc", "Fraction of KV cache blocks in use", stats.kv_usage),
            ("kv_cache_free_blocks", "KV cache blocks free", stats.num_free_blocks),
            ("kv_cache_total_blocks", "KV cache blocks in all", stats.num_total_blocks),
        ):
            yield GaugeMetricFamily(f"trio_llm_{name}", doc, value=value)
        queries, hits = stats.prefix_cache_queries, stats.prefix_cache_hits
        yield CounterMetricFamily(
            "trio_llm_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", queries
        )
        yield CounterMetricFamily(
            "trio_llm_prefix_cache_hits", "Prompt tokens found in the prefix cache", hits
        )
        yield GaugeMetricFamily(
            "trio_llm_prefix_cache_hit_rate",
            "Prefix cache hits over queries since the engine started",
            value=hits / queries if queries else 0.0,
        )
        yield CounterMetricFamily(
            "trio_llm_num_preemptions",
            "Sequences preempted for lack of KV blocks",
            stats.num_preemptions,
        )


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


class _VllmNames(Collector):
    """The families of `_VLLM_NAMES`, renamed, with `model_name` added to every sample."""

    def __init__(self, sources: list[Any], model_name: Callable[[], str | None]) -> None:
        self._sources = sources
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        model = self._model_name() or ""
        for source in self._sources:
            for family in source.collect():
                for alias in _VLLM_NAMES.get(family.name, ()):
                    renamed = Metric(alias, family.documentation, family.type)
                    for sample in family.samples:
                        renamed.add_sample(
                            alias + sample.name[len(family.name) :],
                            {"model_name": model, **sample.labels},
                            sample.value,
                            sample.timestamp,
                            sample.exemplar,
                        )
                    yield renamed


class Metrics:
    def __init__(
        self,
        stats: Callable[[], Any | None],
        model_name: Callable[[], str | None] = lambda: None,
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
        self.prompt_tokens = Counter("trio_llm_prompt_tokens", "Prompt tokens", registry=r)
        self.generation_tokens = Counter(
            "trio_llm_generation_tokens", "Generated tokens", registry=r
        )
        self.finished = Counter(
            "trio_llm_request_success",
            "Finished sequences by finish reason",
            ["finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "trio_llm_time_to_first_token_seconds",
            "Arrival to first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "trio_llm_inter_token_latency_seconds",
            "Gap between tokens (mean over each delivered batch of tokens)",
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "trio_llm_e2e_request_latency_seconds",
            "Arrival to finish",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        engine = _EngineCollector(stats)
        r.register(engine)
        sources = [engine, self.prompt_tokens, self.generation_tokens, self.finished]
        r.register(_VllmNames([*sources, self.ttft, self.itl, self.e2e], model_name))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def recorder(self) -> RequestRecorder:
        return RequestRecorder(self)


class RequestRecorder:
    """Feeds one engine request's outputs (DELTA or FINAL_ONLY) into the metrics."""

    def __init__(self, metrics: Metrics) -> None:
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
                m.finished.labels(o.finish_reason).inc()
        if output.finished and t.finished_time is not None:
            m.e2e.observe(max(0.0, t.finished_time - t.arrival_time))
