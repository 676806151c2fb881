"""What both relays of an attempt share: the client's headers, and failures before the first byte.

:class:`Relay` is the base of :class:`~gateway.proxy.stream.StreamRelay` (an engine's
event stream) and :class:`~gateway.proxy.nonstream.BodyRelay` (a whole answer);
:class:`~gateway.proxy.forward.ProxyCall` combines them with the attempt logic.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping

import aiohttp
import yarl
from aiohttp import web
from multidict import CIMultiDict

from gateway.config.models import ModelConfig
from gateway.engines.runtime import EngineRuntime
from gateway.proxy.result import ProxyResult, Retryable
from gateway.proxy.sse import Patterns, model_patterns
from gateway.telemetry.hooks import RequestTelemetry
from gateway.wire.errors import ApiError, error_response
from gateway.wire.headers import ENGINE, REASON, REQUEST_ID, ROUTE, upstream_headers

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses"}


@functools.lru_cache(maxsize=256)
def upstream_url(base: str, endpoint: str) -> yarl.URL:
    """An engine's URL for ``endpoint`` (chat, completions), parsed once per engine and
    endpoint (aiohttp would parse a string on every request)."""
    return yarl.URL(base + _PATHS[endpoint])


@functools.lru_cache(maxsize=64)
def client_timeout(connect_s: float) -> aiohttp.ClientTimeout:
    # sock_connect bounds a new connection (aiohttp raises ConnectionTimeoutError for it);
    # no ``connect`` limit: it would arm a timer on every request, even on a pooled
    # connection (the pool is unbounded, so nothing waits for a slot; DNS is bounded by
    # the first-byte deadline around the whole call).
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_s)


def engine_headers(
    client: Mapping[str, str], forward: frozenset[str], request_id: str, rt: EngineRuntime
) -> CIMultiDict[str]:
    """The headers of a request to an engine: the client's allow-listed ones, the request
    id, JSON, and the engine's own key."""
    headers = upstream_headers(client, forward)
    headers[REQUEST_ID] = request_id
    headers["Content-Type"] = "application/json"
    headers.update(rt.config.auth_headers())
    return headers


class Relay:
    """Base of the relays (no state of its own: :class:`~gateway.proxy.forward.ProxyCall` holds it)."""

    __slots__ = ()

    request: web.Request
    client_model: str
    include_usage: bool
    model: ModelConfig
    telemetry: RequestTelemetry
    request_id: str

    def _client_headers(self, rt: EngineRuntime, reason: str | None) -> CIMultiDict[str]:
        h: CIMultiDict[str] = CIMultiDict()
        h[REQUEST_ID] = self.request_id
        h[ROUTE] = rt.route.value
        h[REASON] = reason or ""
        h[ENGINE] = rt.name
        return h

    def _patterns(self, rt: EngineRuntime) -> Patterns:
        return model_patterns(rt.config.served_model_name, self.client_model)

    def _fail(
        self,
        rt: EngineRuntime,
        error: str,
        status: int,
        message: str,
        reason: str | None,
        *,
        blame: bool = True,
    ) -> Retryable:
        if blame:
            rt.record_failure(error)
        code = {502: "upstream_unavailable", 504: "upstream_timeout"}.get(status, error)
        err = ApiError(status, message, code=code)
        return Retryable(error, error_response(err, self._client_headers(rt, reason)))

    @contextlib.contextmanager
    def _upstream_read(
        self,
        rt: EngineRuntime,
        result: ProxyResult,
        *,
        timeout_error: str,
        timeout_message: str,
        what: str,
        total: bool = False,
    ) -> Iterator[None]:
        """Map a failed read from the engine (before anything reached the client) to a
        retryable 504 (``timeout_error``) or 502 (the engine dropped the ``what``).

        ``total``: the deadline was the request's total, not the engine's own budget (an
        earlier attempt used the rest): its expiry is not held against this engine."""
        try:
            yield
        except TimeoutError:
            if total:
                raise self._fail(
                    rt,
                    "total_timeout",
                    504,
                    "request exceeded its total time limit",
                    result.reason,
                    blame=False,
                ) from None
            raise self._fail(rt, timeout_error, 504, timeout_message, result.reason) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise self._fail(
                rt,
                "disconnected",
                502,
                f"engine {rt.name} dropped the {what} ({type(exc).__name__})",
                result.reason,
            ) from None
