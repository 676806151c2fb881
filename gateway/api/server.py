"""The gateway's HTTP connection handling on top of aiohttp's server.

:class:`GatewayRunner` is ``web.AppRunner`` with the gateway's connection protocol,
:class:`GatewayRequestHandler`, which adds what aiohttp's own lacks:

- **Header deadline.** A connection must complete its request headers within
  ``server.header_timeout_s`` of opening, and each later request within that time of its
  first byte; otherwise it is closed (an idle or trickling client costs one fd for at most
  that long). Idle keep-alive connections between requests are closed after
  ``server.keepalive_timeout_s`` (aiohttp's keep-alive timer; the connection's first
  request is covered by both). The body has its own deadline (``BODY_TIMEOUT_S``).
- **Connection cap.** Beyond ``server.max_connections`` open connections a new one is
  answered ``503`` (OpenAI-shaped, ``Connection: close``) and closed at once.
- **Low-level errors in OpenAI's shape.** A request aiohttp cannot parse (bad request
  line, invalid header character, header too long, too many headers, bad framing) gets
  a JSON 400 naming the kind of error, never echoing request bytes, and one log line
  without them (rate-limited by the log guard), not aiohttp's traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.api.state import STATE
from gateway.wire.errors import error_body
from gateway.wire.headers import REQUEST_ID, new_request_id

log = logging.getLogger(__name__)

# Fixed descriptions per parser error class, most specific first: never the exception's
# text, which quotes the offending request bytes.
_KINDS: tuple[tuple[type[BaseException], str, str], ...] = (
    (hx.LineTooLong, "the request line or a header is too long", "header_too_large"),
    (hx.InvalidHeader, "the request has an invalid header", "invalid_header"),
    (hx.BadHttpMethod, "the request line has an invalid HTTP method", "invalid_request_line"),
    (hx.BadStatusLine, "the request line is malformed", "invalid_request_line"),
    (hx.InvalidURLError, "the request target is not a valid URL", "invalid_request_line"),
    (hx.PayloadEncodingError, "the request body framing is invalid", "invalid_body_framing"),
)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    max_connections: int = 4096


def describe(exc: BaseException | None) -> tuple[str, str]:
    """A fixed, byte-free message and error code for a low-level parse error."""
    for cls, message, code in _KINDS:
        if isinstance(exc, cls):
            return message, code
    if isinstance(exc, hx.BadHttpMessage) and exc.message.startswith("Too many headers"):
        return "the request has too many headers", "too_many_headers"
    return "malformed HTTP request", "malformed_http"


def _json_error(status: int, message: str, code: str) -> web.Response:
    type_ = "invalid_request_error" if status < 500 else "internal_error"
    resp = web.Response(
        status=status,
        body=json.dumps(error_body(message, type_, code, None)).encode(),
        content_type="application/json",
        headers={REQUEST_ID: new_request_id()},
    )
    resp.force_close()
    return resp


_OVER_CAPACITY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nx-request-id: %s\r\nContent-Length: %d\r\n\r\n%s"
)


def _over_capacity_bytes() -> bytes:
    body = json.dumps(
        error_body(
            "the gateway is at its connection limit; retry shortly",
            "service_unavailable",
            "too_many_connections",
            None,
        )
    ).encode()
    return _OVER_CAPACITY % (new_request_id().encode(), len(body), body)


class GatewayRequestHandler(RequestHandler):
    def __init__(self, manager: web.Server, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._header_timer: asyncio.TimerHandle | None = None

    # -- header deadline -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if manager is not None and len(manager.connections) > self._limits.max_connections:
            log.warning(
                "connection refused: %d open connections (server.max_connections)",
                len(manager.connections),
                extra={"throttle_key": "max_connections"},
            )
            if self.transport is not None:
                self.transport.write(_over_capacity_bytes())
            self.force_close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        waiting = self._waiter is not None and not self._waiter.done()
        if waiting and self._header_timer is None:
            self._arm()  # the first bytes of a new request on a kept-alive connection
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:  # a complete request head (or a parse error)
            self._disarm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self._loop.call_later(self._limits.header_timeout_s, self._header_expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_expired(self) -> None:
        self._header_timer = None
        log.info(
            "closing a connection that sent no complete request head within %gs (server.header_timeout_s)",
            self._limits.header_timeout_s,
            extra={"throttle_key": "header_timeout"},
        )
        self.force_close()

    # -- errors aiohttp handles itself ----------------------------------------------
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("unhandled error on a request from %s", request.remote, exc_info=exc)
            text, code = "internal gateway error", "internal_error"
        else:
            text, code = describe(exc)
            level = logging.DEBUG if isinstance(exc, hx.BadHttpMethod) else logging.WARNING
            log.log(
                level,
                "rejected a malformed HTTP request from %s: %s (%d)",
                request.remote,
                code,
                status,
                extra={"throttle_key": "malformed_http"},
            )
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error response")
        return _json_error(status, text, code)


class GatewayServer(web.Server):
    """``web.Server`` whose protocol factory makes :class:`GatewayRequestHandler`."""

    limits: ConnectionLimits

    def __call__(self) -> RequestHandler:
        return GatewayRequestHandler(self, loop=self._loop, limits=self.limits, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` for the gateway app: its connection limits come from the app's
    ``server:`` configuration."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        server = app[STATE].config.server
        kwargs.setdefault("keepalive_timeout", server.keepalive_timeout_s)
        super().__init__(app, **kwargs)
        self._limits = ConnectionLimits(server.header_timeout_s, server.max_connections)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # The same object, made by aiohttp with all its settings; only the protocol
        # factory (``__call__``) is the gateway's.
        server.__class__ = GatewayServer
        assert isinstance(server, GatewayServer)
        server.limits = self._limits
        return server
