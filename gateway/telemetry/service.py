"""The Prometheus + OpenTelemetry + access-log implementation of the telemetry hooks."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from gateway.config.telemetry import TelemetryConfig
from gateway.routing.types import Decision, RequestFeatures
from gateway.telemetry import logs
from gateway.telemetry.hooks import RequestTelemetry
from gateway.telemetry.labels import clean
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.spans import end_span
from gateway.telemetry.state import RoutingStateCollector, StateSource
from gateway.telemetry.tracing import PROPAGATOR, Tracing, trace_headers, tracing_from_env

log = logging.getLogger("specgate.telemetry")

NONE = "none"


_ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses"}


def _http_route(endpoint: str) -> str:
    """The HTTP path of an endpoint token (``chat`` -> ``/v1/chat/completions``)."""
    return _ROUTES.get(endpoint, endpoint if endpoint.startswith("/") else f"/{endpoint}")


def _status_label(status: int) -> str:
    if status == 0:  # an answer relayed by Envoy whose response the Endpoint Picker did not watch
        return "unobserved"
    return str(status) if 100 <= status <= 599 else "other"


class GatewayTelemetry:
    """Implements :class:`~gateway.telemetry.hooks.Telemetry` with metrics, traces and logs."""

    def __init__(
        self,
        config: TelemetryConfig | None = None,
        *,
        tracing: Tracing | None = None,
        state_source: StateSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or TelemetryConfig()
        cfg = self.config
        self.clock = clock
        self.metrics = GatewayMetrics(
            known_models=cfg.known_models,
            max_label_values=cfg.max_label_values,
            process_metrics=cfg.process_metrics,
            clock=clock,
        )
        self.state = RoutingStateCollector(state_source, cfg.max_label_values)
        self.metrics.registry.register(self.state)
        if tracing is None:
            tracing = tracing_from_env(cfg.service_name) if cfg.tracing == "auto" else Tracing(None)
        self.tracing = tracing

    @property
    def registry(self) -> Any:
        return self.metrics.registry

    def set_state_source(self, source: StateSource | None) -> None:
        """Where the live routing state comes from (read at each /metrics scrape)."""
        self.state.source = source

    def prime_engines(self, engines: list[str]) -> None:
        """Series that exist from the start at 0 (a rate over them is 0, not "no data")."""
        m = self.metrics
        for name in engines:
            m.stream_moves.labels(m.engine(name), "moved")

    def forget_engines(self, engines: list[str]) -> None:
        """Engines whose pair left the fleet: their per-engine series end (bounded cardinality)."""
        self.metrics.forget_engines(engines)

    def record_scrape(
        self, engine: str, ok: bool, duration_s: float | None = None, error: str | None = None
    ) -> None:
        """Engine scraper hook: one call per scrape attempt of an engine's /metrics."""
        self.metrics.record_scrape(engine, ok, duration_s, error)

    def exposition(self) -> bytes:
        return self.metrics.exposition()

    def access_log_entry(self, result: str) -> None:
        self.metrics.access_log.labels(result).inc()

    def start_request(
        self, model: str, endpoint: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestTelemetry:
        try:
            return _Request(self, model, endpoint, request_id, headers)
        except Exception:  # pragma: no cover - never break the request path
            log.exception("telemetry start_request failed")
            from gateway.telemetry.hooks import NullTelemetry

            return NullTelemetry().start_request(model, endpoint, request_id, headers)

    async def aclose(self) -> None:
        """Flush and stop the trace exporters (off the event loop)."""
        await asyncio.to_thread(self.tracing.shutdown)


class _Request:
    __slots__ = (
        "_attempt_engine",
        "_attempt_span",
        "_attempt_t0",
        "_attempts",
        "_done",
        "_engine",
        "_incoming",
        "_predicted_acceptance",
        "_predicted_speedup",
        "_probe",
        "_reason",
        "_reasoning",
        "_route",
        "_span",
        "_t0",
        "_t_content",
        "_t_first",
        "endpoint",
        "model",
        "request_id",
        "tel",
    )

    def __init__(
        self, tel: GatewayTelemetry, model: str, endpoint: str, request_id: str, headers: Mapping[str, str]
    ) -> None:
        m = tel.metrics
        self.tel = tel
        self._t0 = tel.clock()
        self.model = m.model(model)
        self.endpoint = m.endpoint(endpoint)
        self.request_id = clean(request_id)
        self._route = NONE
        self._reason = NONE
        self._engine: str | None = None
        self._probe = False
        self._predicted_speedup: float | None = None
        self._predicted_acceptance: float | None = None
        self._t_first: float | None = None
        self._t_content: float | None = None
        self._reasoning: int | None = None
        self._attempts = 0
        self._attempt_engine: str | None = None
        self._attempt_t0 = 0.0
        self._attempt_span: Span | None = None
        self._done = False
        self._incoming = trace_headers(headers)
        self._span: Span | None = None
        tracer = tel.tracing.tracer
        if tracer is not None:
            parent = PROPAGATOR.extract(self._incoming) if self._incoming else None
            route = _http_route(self.endpoint)
            self._span = tracer.start_span(
                f"POST {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={
                    "http.request.method": "POST",
                    "http.route": route,
                    "gen_ai.request.model": self.model,
                    "specgate.model": self.model,
                    "specgate.request_id": self.request_id,
                },
            )

    # -- hooks ------------------------------------------------------------------------
    def decided(self, features: RequestFeatures, decision: Decision, decision_seconds: float) -> None:
        try:
            m = self.tel.metrics
            self._route = decision.route.value
            self._reason = m.reason(decision.reason)
            self._engine = m.engine(decision.engine)
            self._probe = decision.probe
            self._predicted_speedup = decision.predicted_speedup
            self._predicted_acceptance = decision.predicted_acceptance
            if decision_seconds >= 0:
                m.decision.labels(self.model).observe(decision_seconds)
            if self._span is not None:
                attrs: dict[str, str | bool | float | int] = {
                    "specgate.route": self._route,
                    "specgate.reason": self._reason,
                    "specgate.engine": self._engine,
                    "specgate.probe": decision.probe,
                    "specgate.request.kind": clean(features.kind),
                    "specgate.request.overlap": features.overlap,
                    "gen_ai.request.temperature": features.temperature,
                    "specgate.decision_seconds": decision_seconds,
                }
                if decision.predicted_speedup is not None:
                    attrs["specgate.predicted_speedup"] = decision.predicted_speedup
                if decision.predicted_acceptance is not None:
                    attrs["specgate.predicted_acceptance"] = decision.predicted_acceptance
                if decision.fallback is not None:
                    attrs["specgate.fallback"] = clean(decision.fallback)
                self._span.set_attributes(attrs)
        except Exception:  # pragma: no cover
            log.exception("telemetry decided() failed")

    def upstream_started(self, engine: str, attempt: int) -> Mapping[str, str]:
        try:
            self._end_attempt(None)
            m = self.tel.metrics
            e = m.engine(engine)
            self._attempts += 1
            self._attempt_engine = e
            self._attempt_t0 = self.tel.clock()
            m.inflight.labels(e).inc()
            tracer = self.tel.tracing.tracer
            out: dict[str, str] = {}
            if tracer is not None and self._span is not None:
                ctx = trace.set_span_in_context(self._span, Context())
                self._attempt_span = tracer.start_span(
                    f"upstream {e}",
                    context=ctx,
                    kind=SpanKind.CLIENT,
                    attributes={
                        "specgate.engine": e,
                        "specgate.attempt": attempt,
                        "specgate.route": self._route,
                    },
                )
                PROPAGATOR.inject(out, context=trace.set_span_in_context(self._attempt_span, Context()))
            elif self._incoming:
                # Tracing off: pass the client's trace context through, validated, unchanged.
                PROPAGATOR.inject(out, context=PROPAGATOR.extract(self._incoming))
            return out
        except Exception:  # pragma: no cover
            log.exception("telemetry upstream_started() failed")
            return {}

    def upstream_first_byte(self, engine: str) -> None:
        try:
            dt = self.tel.clock() - self._attempt_t0
            self.tel.metrics.upstream_ttfb.labels(self.tel.metrics.engine(engine)).observe(max(dt, 0.0))
            if self._attempt_span is not None:
                self._attempt_span.set_attribute("specgate.upstream.time_to_first_byte_s", dt)
                self._attempt_span.add_event("first_byte")
        except Exception:  # pragma: no cover
            log.exception("telemetry upstream_first_byte() failed")

    def upstream_failed(self, engine: str, error: str, retried: bool) -> None:
        try:
            m = self.tel.metrics
            e, err = m.engine(engine), m.error(error)
            m.upstream_failures.labels(e, err).inc()
            if retried:
                m.upstream_retries.labels(e, err).inc()
            self._end_attempt(err)
        except Exception:  # pragma: no cover
            log.exception("telemetry upstream_failed() failed")

    def stream_moved(self, engine: str, result: str) -> None:
        try:
            m = self.tel.metrics
            m.stream_moves.labels(m.engine(engine), m.error(result)).inc()
            if self._span is not None:
                self._span.add_event("stream_moved", {"specgate.engine": engine, "specgate.result": result})
        except Exception:  # pragma: no cover
            log.exception("telemetry stream_moved() failed")

    def first_token(self) -> None:
        if self._t_first is None:
            self._t_first = self.tel.clock()
            if self._span is not None:
                self._span.add_event("first_token")

    def first_content(self) -> None:
        if self._t_content is None:
            self._t_content = self.tel.clock()
            if self._span is not None:
                self._span.add_event("first_content")

    def reasoning_tokens(self, tokens: int) -> None:
        self._reasoning = tokens

    def finished(
        self,
        status: int,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        error: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """The request is over: count it. ``duration_s``: its duration as measured elsewhere
        (Envoy's access log, which reaches the EPP after the request's end), instead of the
        time since it started."""
        if self._done:
            return
        self._done = True
        try:
            self._finish(status, prompt_tokens, completion_tokens, error, duration_s)
        except Exception:  # pragma: no cover
            log.exception("telemetry finished() failed")

    # -- internals --------------------------------------------------------------------
    def _end_attempt(self, error: str | None) -> None:
        if self._attempt_engine is None:
            return
        self.tel.metrics.inflight.labels(self._attempt_engine).dec()
        self._attempt_engine = None
        span, self._attempt_span = self._attempt_span, None
        if span is not None:
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR, error))
            span.end()

    def _finish(
        self,
        status: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        error: str | None,
        duration_s: float | None = None,
    ) -> None:
        tel, m = self.tel, self.tel.metrics
        now = tel.clock()
        ok = status < 400 and error is None
        self._end_attempt(None if ok else m.error(error or f"status_{status // 100}xx"))
        route = self._route
        m.requests.labels(self.model, self.endpoint, route, self._reason, _status_label(status)).inc()
        duration = max(now - self._t0 if duration_s is None else duration_s, 0.0)
        m.e2e.labels(self.model, route).observe(duration)
        ttft = tpot = ttfc = None
        if ok and self._t_first is not None:
            ttft = max(self._t_first - self._t0, 0.0)
            if completion_tokens is not None and completion_tokens > 1:
                tpot = max(now - self._t_first, 0.0) / (completion_tokens - 1)
        if ok and self._t_content is not None:
            ttfc = max(self._t_content - self._t0, 0.0)
        if ok:
            m.answered(
                self.model, route, ttft, ttfc, tpot, (prompt_tokens, completion_tokens, self._reasoning)
            )
        trace_id = None
        if self._span is not None:
            attrs: dict[str, int | float | None] = {
                "http.response.status_code": status,
                "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": completion_tokens,
                "gen_ai.usage.reasoning.output_tokens": self._reasoning,
                "specgate.ttft_s": ttft,
                "specgate.time_to_first_content_s": ttfc,
                "specgate.tpot_s": tpot,
                "specgate.attempts": self._attempts,
            }
            err = None if ok else (m.error(error) if error else f"status_{status}")
            trace_id = end_span(self._span, attrs, err, duration if duration_s is not None else None)
        if tel.config.access_log and logs.access_log.isEnabledFor(logging.INFO):
            logs.emit(
                {
                    "event": "request",
                    "request_id": self.request_id,
                    "model": self.model,
                    "endpoint": self.endpoint,
                    "route": route,
                    "reason": self._reason,
                    "engine": self._engine,
                    "probe": self._probe,
                    "status": status,
                    "error": clean(error) if error else None,
                    "attempts": self._attempts,
                    "duration_ms": round(duration * 1000, 3),
                    "ttft_ms": round(ttft * 1000, 3) if ttft is not None else None,
                    "tpot_ms": round(tpot * 1000, 4) if tpot is not None else None,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "predicted_speedup": self._predicted_speedup,
                    "predicted_acceptance": self._predicted_acceptance,
                    "trace_id": trace_id,
                },
                tel.config.log_format,
            )


def build_telemetry(
    config: TelemetryConfig | Mapping[str, Any] | None = None,
    *,
    known_models: Iterable[str] | None = None,
    state_source: StateSource | None = None,
) -> GatewayTelemetry:
    """The gateway's telemetry as configured (tracing per the ``OTEL_*`` environment).

    ``config`` is the gateway config's ``telemetry`` section (a :class:`TelemetryConfig`), or
    such a section as a mapping (validated here; unknown keys are an error). ``known_models``
    (the configured model names) bounds the ``model`` label unless the config already lists them.
    """
    cfg = (
        config if isinstance(config, TelemetryConfig) else TelemetryConfig.model_validate(dict(config or {}))
    )
    if known_models is not None and cfg.known_models is None:
        cfg = cfg.model_copy(update={"known_models": tuple(known_models)})
    return GatewayTelemetry(cfg, state_source=state_source)
