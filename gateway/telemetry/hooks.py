"""The seam between the request path and telemetry (metrics, traces, logs).

The proxy calls these hooks at fixed points of a request's life; it knows nothing of
Prometheus or OpenTelemetry. :class:`NullTelemetry` is the do-nothing implementation
used where telemetry is off and in unit tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gateway.routing.types import Decision, RequestFeatures


class RequestTelemetry(Protocol):
    """Telemetry for one client request. Every method is cheap and never raises."""

    def decided(self, features: RequestFeatures, decision: Decision, decision_seconds: float) -> None: ...

    def upstream_started(self, engine: str, attempt: int) -> Mapping[str, str]:
        """Called before each upstream attempt; returns headers to inject (e.g. ``traceparent``)."""
        ...

    def upstream_first_byte(self, engine: str) -> None: ...

    def upstream_failed(self, engine: str, error: str, retried: bool) -> None:
        """``error`` is a bounded token such as ``connect``, ``first_byte_timeout``, ``status_5xx``."""
        ...

    def first_token(self) -> None:
        """The first token of any kind (reasoning, content, tool call) reached the client (TTFT)."""
        ...

    def first_content(self) -> None:
        """The first content (or tool call) token reached the client: after the thinking."""
        ...

    def reasoning_tokens(self, tokens: int) -> None:
        """The answer's reasoning tokens (part of its completion tokens); before ``finished``."""
        ...

    def stream_moved(self, engine: str, result: str) -> None:
        """A regime flip asked this stream to leave ``engine``: ``moved`` (the sibling
        continues it) or why it stayed (``tokenize``, ``status_503``, ...)."""
        ...

    def finished(
        self,
        status: int,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        error: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        """Called exactly once per request, whatever happened (``duration_s``: its duration
        as measured elsewhere, instead of the time since it started)."""
        ...


class Telemetry(Protocol):
    def start_request(
        self, model: str, endpoint: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestTelemetry:
        """``headers`` are the incoming request headers (for trace context extraction)."""
        ...

    def access_log_entry(self, result: str) -> None:
        """The EPP read Envoy's access log: ``matched``, ``unmatched``, ``missed`` or
        ``undecodable`` (:mod:`gateway.api.epp.endings`)."""
        ...


class _NullRequest:
    __slots__ = ()

    def decided(self, features: RequestFeatures, decision: Decision, decision_seconds: float) -> None:
        return None

    def upstream_started(self, engine: str, attempt: int) -> Mapping[str, str]:
        return {}

    def upstream_first_byte(self, engine: str) -> None:
        return None

    def upstream_failed(self, engine: str, error: str, retried: bool) -> None:
        return None

    def first_token(self) -> None:
        return None

    def first_content(self) -> None:
        return None

    def reasoning_tokens(self, tokens: int) -> None:
        return None

    def stream_moved(self, engine: str, result: str) -> None:
        return None

    def finished(
        self,
        status: int,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        error: str | None = None,
        duration_s: float | None = None,
    ) -> None:
        return None


_NULL_REQUEST = _NullRequest()


class NullTelemetry:
    def start_request(
        self, model: str, endpoint: str, request_id: str, headers: Mapping[str, str]
    ) -> RequestTelemetry:
        return _NULL_REQUEST

    def access_log_entry(self, result: str) -> None:
        return None
