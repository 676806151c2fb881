"""The gateway's own Prometheus metrics, in their own :class:`CollectorRegistry`.

Names follow Prometheus conventions (``specgate_`` prefix, base units, ``_total`` counters).
Every label value passes a :class:`~gateway.telemetry.labels.LabelGuard`, so the number of
series stays bounded whatever clients send. The registry leaves out the ``*_created``
samples prometheus_client adds to every counter, histogram and summary (one more series
each, which nothing here reads); only this registry: an emulated vLLM in the same process
keeps vLLM's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.telemetry.labels import LabelGuard, clean

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2)
SCRAPE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Registry(CollectorRegistry):
    """A :class:`CollectorRegistry` whose exposition has no ``<name>_created`` samples."""

    def collect(self) -> Iterable[Metric]:
        for metric in super().collect():
            if metric.type in _WITH_CREATED:
                created = metric.name + "_created"
                metric.samples = [s for s in metric.samples if s.name != created]
            yield metric


_WITH_CREATED = frozenset({"counter", "histogram", "summary"})


class _Labelled:
    """A labelled metric whose children are cached (``labels()`` validates and locks each call)."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child

    def remove_first(self, value: str) -> None:
        """Drop every child whose first label is ``value`` (an engine that left)."""
        for key in [k for k in self._children if k[0] == value]:
            del self._children[key]
            self.metric.remove(*key)


class GatewayMetrics:
    """All request-path and scrape metrics of one gateway process."""

    def __init__(
        self,
        *,
        known_models: tuple[str, ...] | None = None,
        max_label_values: int = 64,
        process_metrics: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = Registry(auto_describe=True)
        self.clock = clock
        r = self.registry
        self.model = LabelGuard(
            max_label_values, tuple(clean(m) for m in known_models) if known_models else None
        )
        self.engine = LabelGuard(max_label_values)
        self.reason = LabelGuard(max_label_values)
        self.error = LabelGuard(max_label_values)
        self.endpoint = LabelGuard(16)
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)

        self.requests = _Labelled(
            Counter(
                "specgate_requests",
                "Client requests by model, route, routing reason and HTTP status.",
                ["model", "endpoint", "route", "reason", "status"],
                registry=r,
            )
        )
        self.ttft = _Labelled(
            Histogram(
                "specgate_time_to_first_token_seconds",
                "Time from request arrival to the first token sent to the client, of any kind "
                "(reasoning, content or a tool call).",
                ["model", "route"],
                buckets=TTFT_BUCKETS,
                registry=r,
            )
        )
        self.ttfc = _Labelled(
            Histogram(
                "specgate_time_to_first_content_seconds",
                "Time from request arrival to the first content (or tool call) token sent to the "
                "client: after a reasoning model's thinking.",
                ["model", "route"],
                buckets=TTFT_BUCKETS,
                registry=r,
            )
        )
        self.tpot = _Labelled(
            Histogram(
                "specgate_time_per_output_token_seconds",
                "Per-request mean time per output token after the first (gateway's own stream timing).",
                ["model", "route"],
                buckets=TPOT_BUCKETS,
                registry=r,
            )
        )
        self.e2e = _Labelled(
            Histogram(
                "specgate_request_duration_seconds",
                "End-to-end request duration as the gateway saw it.",
                ["model", "route"],
                buckets=E2E_BUCKETS,
                registry=r,
            )
        )
        self.output_tokens = _Labelled(
            Counter(
                "specgate_output_tokens",
                "Completion tokens served, by model and route.",
                ["model", "route"],
                registry=r,
            )
        )
        self.reasoning_tokens = _Labelled(
            Counter(
                "specgate_reasoning_tokens",
                "Reasoning tokens served (part of the output tokens), by model and route.",
                ["model", "route"],
                registry=r,
            )
        )
        self.prompt_tokens = _Labelled(
            Counter(
                "specgate_prompt_tokens",
                "Prompt tokens served, by model and route.",
                ["model", "route"],
                registry=r,
            )
        )
        self.decision = _Labelled(
            Histogram(
                "specgate_decision_duration_seconds",
                "Time the routing policy took to decide one request.",
                ["model"],
                buckets=DECISION_BUCKETS,
                registry=r,
            )
        )
        self.inflight = _Labelled(
            Gauge(
                "specgate_upstream_inflight_requests",
                "Requests the gateway has in flight on each engine (exact, the gateway's own count).",
                ["engine"],
                registry=r,
            )
        )
        self.upstream_ttfb = _Labelled(
            Histogram(
                "specgate_upstream_time_to_first_byte_seconds",
                "Time from sending an upstream request to its first response byte.",
                ["engine"],
                buckets=TTFT_BUCKETS,
                registry=r,
            )
        )
        self.upstream_failures = _Labelled(
            Counter(
                "specgate_upstream_failures",
                "Failed upstream attempts by engine and error kind.",
                ["engine", "error"],
                registry=r,
            )
        )
        self.upstream_retries = _Labelled(
            Counter(
                "specgate_upstream_retries",
                "Failed upstream attempts that were retried (on the same or the sibling engine).",
                ["engine", "error"],
                registry=r,
            )
        )
        self.stream_moves = _Labelled(
            Counter(
                "specgate_stream_moves",
                "Streams a regime flip asked to leave an engine for its sibling, by the engine left and "
                "the result: moved (the sibling continues the answer) or why the stream stayed.",
                ["engine", "result"],
                registry=r,
            )
        )
        self.access_log = _Labelled(
            Counter(
                "specgate_epp_access_log_entries",
                "Envoy's access log at the Endpoint Picker, by result: matched (an entry of a request it "
                "routed, finished from the entry), unmatched (an entry of no request it waits for) and "
                "missed (a request whose entry did not come in time, finished without it) and undecodable.",
                ["result"],
                registry=r,
            )
        )
        self.scrapes = _Labelled(
            Counter(
                "specgate_engine_scrapes",
                "Scrapes of each engine's /metrics by result (ok or an error kind).",
                ["engine", "result"],
                registry=r,
            )
        )
        self.scrape_duration = _Labelled(
            Histogram(
                "specgate_engine_scrape_duration_seconds",
                "Duration of successful scrapes of each engine's /metrics.",
                ["engine"],
                buckets=SCRAPE_BUCKETS,
                registry=r,
            )
        )
        self._last_scrape_ok: dict[str, float] = {}
        self._first_scrape: dict[str, float] = {}
        r.register(_ScrapeAgeCollector(self))

    # -- scraper hook --------------------------------------------------------------------

    def answered(
        self,
        model: str,
        route: str,
        ttft: float | None,
        ttfc: float | None,
        tpot: float | None,
        tokens: tuple[int | None, int | None, int | None],
    ) -> None:
        """A request answered: its timings (those it has) and its prompt, output and reasoning tokens."""
        for hist, value in ((self.ttft, ttft), (self.ttfc, ttfc), (self.tpot, tpot)):
            if value is not None:
                hist.labels(model, route).observe(value)
        counters = (self.prompt_tokens, self.output_tokens, self.reasoning_tokens)
        for counter, n in zip(counters, tokens, strict=True):
            if n:
                counter.labels(model, route).inc(n)

    def record_scrape(
        self, engine: str, ok: bool, duration_s: float | None = None, error: str | None = None
    ) -> None:
        """Called by the engine scraper after each scrape attempt. Never raises."""
        try:
            e = self.engine(engine)
            now = self.clock()
            self._first_scrape.setdefault(e, now)
            if ok:
                self.scrapes.labels(e, "ok").inc()
                self._last_scrape_ok[e] = now
                if duration_s is not None and duration_s >= 0:
                    self.scrape_duration.labels(e).observe(duration_s)
            else:
                self.scrapes.labels(e, self.error(error or "error")).inc()
        except Exception:  # pragma: no cover - telemetry must never break scraping
            return

    def forget_engines(self, engines: Iterable[str]) -> None:
        """Engines gone from the fleet (their pair drained and left): their series end, their
        scrape age stops being exported, and their label values are free for new engines."""
        for name in engines:
            e = self.engine(name)
            for metric in (
                self.inflight,
                self.upstream_ttfb,
                self.upstream_failures,
                self.upstream_retries,
                self.stream_moves,
                self.scrapes,
                self.scrape_duration,
            ):
                metric.remove_first(e)
            self._last_scrape_ok.pop(e, None)
            self._first_scrape.pop(e, None)
            self.engine.forget(name)

    def scrape_ages(self) -> dict[str, float]:
        """Seconds since each engine's last successful scrape (since its first attempt if none)."""
        now = self.clock()
        return {e: now - self._last_scrape_ok.get(e, t0) for e, t0 in self._first_scrape.items()}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _ScrapeAgeCollector(Collector):
    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def describe(self) -> Iterable[Metric]:
        return [
            GaugeMetricFamily(
                "specgate_engine_scrape_age_seconds",
                "Seconds since the last successful scrape of the engine.",
            )
        ]

    def collect(self) -> Iterable[Metric]:
        g = GaugeMetricFamily(
            "specgate_engine_scrape_age_seconds",
            "Seconds since the last successful scrape of the engine.",
            labels=["engine"],
        )
        for engine, age in sorted(self._m.scrape_ages().items()):
            g.add_metric([engine], age)
        return [g]
