"""OpenTelemetry tracing, configured from the standard ``OTEL_*`` environment variables.

Tracing is on only when the environment asks for an exporter:

- ``OTEL_TRACES_EXPORTER=otlp`` (or ``console``; ``none`` turns it off), or
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set (implies otlp);
- ``OTEL_SDK_DISABLED=true`` turns it off whatever else is set.

OTLP speaks http/protobuf (the default) or grpc, as ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``) says; both exporters come with
``pip install 'specgate[otlp]'`` and in the container image. A protocol whose exporter is
not installed, or an unknown one, logs a warning and leaves OTLP off (the gateway still
starts). Endpoint, headers, timeout, TLS and
compression come from the exporter's own ``OTEL_EXPORTER_OTLP_*`` variables, sampling from
``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``, the service name from
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``. When off, the gateway creates no spans
at all and only forwards an incoming ``traceparent`` to the engine unchanged.

The gateway uses its own :class:`TracerProvider` and never touches the global one.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("specgate.telemetry")

PROPAGATOR = TraceContextTextMapPropagator()
TRACE_HEADERS = ("traceparent", "tracestate")


class TracingConfigError(ValueError):
    """The OTEL_* environment asks for something this gateway cannot do."""


class Tracing:
    """A tracer (or none, when tracing is off) and its provider's lifecycle."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = provider.get_tracer("specgate") if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    def shutdown(self) -> None:
        """Flush and stop exporters (blocking: call it off the event loop)."""
        if self.provider is not None:
            self.provider.shutdown()


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in {"1", "true", "yes", "on"}


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """Which exporters the environment asks for ([] = tracing off)."""
    if _truthy(env.get("OTEL_SDK_DISABLED")):
        return []
    raw = env.get("OTEL_TRACES_EXPORTER")
    if raw is not None and raw.strip():
        names = [n.strip().lower() for n in raw.split(",") if n.strip()]
        return [] if "none" in names else names
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return ["otlp"]
    return []


# OTLP protocol (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL) -> (exporter module, its package).
_OTLP = {
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
    ),
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
    ),
}


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter | None:
    """The OTLP exporter of the protocol the environment names (default http/protobuf);
    None, with a warning, when that protocol is unknown or its exporter is not installed:
    tracing is an aid, and a pod must not crash-loop over it."""
    proto = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
    ).strip().lower() or "http/protobuf"
    if proto not in _OTLP:
        log.warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%r is not supported (grpc or http/protobuf): OTLP tracing off",
            proto[:40],
        )
        return None
    module, package = _OTLP[proto]
    try:
        mod = importlib.import_module(module)
    except ImportError:
        log.warning(
            "OTLP tracing over %s requested by OTEL_* variables, but %s is not installed "
            "(pip install 'specgate[otlp]'): OTLP tracing off",
            proto,
            package,
        )
        return None
    exporter: SpanExporter = mod.OTLPSpanExporter()
    return exporter


def tracing_from_env(service_name: str = "specgate", env: Mapping[str, str] | None = None) -> Tracing:
    """Build tracing as the ``OTEL_*`` environment says; off when it says nothing."""
    env = os.environ if env is None else env
    names = exporter_names(env)
    if not names:
        return Tracing(None)
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            otlp = _otlp_exporter(env)
            if otlp is not None:
                exporters.append(otlp)
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER={name!r}: specgate supports otlp, console or none"
            )
    if not exporters:
        return Tracing(None)
    provider = TracerProvider(resource=_resource(service_name, env))
    for exp in exporters:
        provider.add_span_processor(BatchSpanProcessor(exp))
    log.info("tracing on: exporters %s", ",".join(names))
    return Tracing(provider)


def tracing_with_exporter(exporter: SpanExporter, service_name: str = "specgate") -> Tracing:
    """Tracing into one exporter, synchronously (tests: the SDK's InMemorySpanExporter)."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider)


def _resource(service_name: str, env: Mapping[str, str]) -> Resource:
    attrs: dict[str, str] = {}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attrs[SERVICE_NAME] = service_name
    return Resource.create(attrs)


def trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace-context headers of ``headers`` (case-insensitive), validated by length."""
    out: dict[str, str] = {}
    if isinstance(headers, CIMultiDictProxy | CIMultiDict):  # aiohttp's: two C lookups, no loop
        for k in TRACE_HEADERS:
            v = headers.get(k)
            if v is not None and len(v) <= 512 and v.isprintable():
                out[k] = v
        return out
    for k, v in headers.items():
        lk = k.lower()
        if lk in TRACE_HEADERS and isinstance(v, str) and len(v) <= 512 and v.isprintable():
            out[lk] = v
    return out
