"""The Endpoint Picker's listener, wired into the gateway app.

``epp.enabled`` adds, beside the HTTP port, an HTTP/2 listener serving two gRPC methods:
``envoy.service.ext_proc.v3.ExternalProcessor/Process`` (:mod:`gateway.api.epp.extproc`)
and ``grpc.health.v1.Health/Check`` (:mod:`gateway.envoy.health`), and takes Envoy's access
log, ``envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs``
(:mod:`gateway.api.epp.endings`). It shares the gateway's
state: the same models, policies, scrapers, health checks, metrics, admin state and peer
channel as the proxy, so a request decided here is counted and learned from as one the
proxy relayed. It starts after the gateway's own start-up and stops before its cleanup;
on SIGTERM the gateway drains (readiness NOT_SERVING, new requests 503) as it does for
the proxy.

The listener is guarded (docs/epp-security.md): each connection's frames are budgeted and
its memory bounded (:mod:`gateway.envoy.h2guard`), all connections together share one
memory bound, connections past ``epp.limits.max_connections`` are closed as they come, and
with ``epp.auth_token`` every stream must carry the shared secret (UNAUTHENTICATED
otherwise; the gRPC health service, which tells only readiness, is open to probes); with
``epp.tls_client_ca`` the TLS handshake itself requires Envoy's client certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import ssl
import time

from aiohttp import web

from gateway.api.epp.endings import AccessLogStream, Endings
from gateway.api.epp.endpoints import EndpointBook
from gateway.api.epp.extproc import ExtProcStream, budget
from gateway.api.epp.fleet import follow_fleet
from gateway.api.epp.listener import Listener
from gateway.api.learning import SampleBudget
from gateway.api.state import STATE, GatewayState
from gateway.config.epp import EppConfig
from gateway.envoy.accesslog import PATH as ACCESS_LOG_PATH
from gateway.envoy.h2 import H2Connection
from gateway.envoy.h2guard import Limits, MemoryPool, Turn
from gateway.envoy.h2stream import Stream, StreamHandler
from gateway.envoy.health import PATH as HEALTH_PATH
from gateway.envoy.health import HealthCheck

log = logging.getLogger(__name__)

PROCESS_PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_SWEEP_S = 1.0
GRPC_UNAUTHENTICATED = 16


def h2_limits(cfg: EppConfig) -> Limits:
    """The HTTP/2 layer's budgets and bounds from the ``epp.limits`` config."""
    lim = cfg.limits
    return Limits(
        ping=(lim.ping.rate, lim.ping.burst),
        settings=(lim.settings.rate, lim.settings.burst),
        early_reset=(lim.early_reset.rate, lim.early_reset.burst),
        continuation=(lim.continuation.rate, lim.continuation.burst),
        window_update=(lim.window_update.rate, lim.window_update.burst),
        empty=(lim.empty.rate, lim.empty.burst),
        streams=(lim.streams.rate, lim.streams.burst),
        other=(lim.other.rate, lim.other.burst),
        stream_memory=lim.stream_memory_bytes,
        connection_memory=lim.connection_memory_bytes,
        connection_window=lim.connection_window_bytes,
        stream_window=lim.stream_window_bytes,
        write_buffer=lim.write_buffer_bytes,
        slice_s=lim.slice_ms / 1000.0,
        overdrawn_share=lim.overdrawn_share,
    )


class EppServer:
    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.config = state.config.epp
        self.book = EndpointBook(state.engines)
        follow_fleet(self.book, state.fleet)  # pairs that join and leave (gateway.fleet)
        self.connections: set[H2Connection] = set()
        self.limits = h2_limits(self.config)
        self.pool = MemoryPool(self.config.limits.process_memory_bytes)
        self.turn = Turn(self.limits.slice_s)  # the loop's time all EPP connections share
        # ... and the slower line of those that had streams ended for memory
        self.overdrawn_turn = Turn(self.limits.slice_s, self.limits.overdrawn_share)
        token = self.config.auth_token
        self._token = f"Bearer {token.get_secret_value()}".encode() if token is not None else None
        self.listener = Listener(
            self._connection,
            max_connections=self.config.limits.max_connections,
            accepts_per_s=self.config.limits.accepts_per_s,
        )
        self.unauthenticated = 0  # streams refused for want of the shared secret
        self._tasks: list[asyncio.Task[None]] = []
        self._budgets: dict[str, SampleBudget] = {}
        # Answers watched (their response headers asked for): as many a second as the models'
        # sampling budgets together, decided before the body names the model.
        self._watch = budget(self.config.observe_per_s * max(1, len(state.models)))
        self.port: int | None = None
        self.endings = Endings(state.telemetry.access_log_entry)

    # -- services ---------------------------------------------------------------------
    def open_stream(self, stream: Stream) -> StreamHandler | None:
        # The health service says only whether the EPP can pick: open to probes (the kubelet's
        # gRPC probe carries no metadata); everything else needs the shared secret.
        if self._token is not None and stream.path != HEALTH_PATH:
            given = (stream.header("authorization") or "").encode()
            if not hmac.compare_digest(given, self._token):
                self.unauthenticated += 1
                log.warning(
                    "EPP: a stream from %s without the shared secret (epp.auth_token)",
                    stream.conn.peer_host or "?",
                    extra={"throttle_key": "epp_unauthenticated"},
                )
                stream.finish(GRPC_UNAUTHENTICATED, "unauthenticated")
                return None
        if stream.path == PROCESS_PATH:
            return ExtProcStream(self, stream)
        if stream.path == HEALTH_PATH:
            return HealthCheck(stream, self.ready)
        if stream.path == ACCESS_LOG_PATH:
            return AccessLogStream(self.endings, stream)
        return None

    def ready(self) -> bool:
        """Can pick: not draining, and every model has an engine with a known address that
        is healthy."""
        st = self.state
        if st.draining:
            return False
        now = time.monotonic()
        return all(
            any(self.book.address(e.name) and e.healthy(now) for e in mrt.engines.values())
            for mrt in st.models.values()
        )

    def admin_state(self) -> dict[str, object]:
        """For ``/admin/state``: Envoy's connections, and its access log (streams open,
        requests expected in it, those of them whose ext_proc stream already ended)."""
        e = self.endings
        return {
            "port": self.port,
            "connections": len(self.connections),
            "connections_refused": self.listener.refused,
            "connections_overdrawn": sum(1 for c in self.connections if c.overdrawn_streams),
            "streams_unauthenticated": self.unauthenticated,
            "memory_bytes": self.pool.used,
            "memory_peak_bytes": self.pool.peak,
            "access_log": {"streams": e.streams, "expected": len(e), "stream_ended": e.waiting},
        }

    def watch(self) -> bool:
        """Whether to ask for this request's response headers (its status, the engine that
        served it, and a chance of its body being read)."""
        return self.config.observe_per_s > 0 and self._watch.take()

    def sample(self, model: str) -> bool:
        """Whether to read this answer's body (``epp.observe_per_s`` per model)."""
        rate = self.config.observe_per_s
        if rate <= 0:
            return False
        b = self._budgets.get(model)
        if b is None:
            b = self._budgets[model] = budget(rate)
        return b.take()

    # -- life -------------------------------------------------------------------------
    def _connection(self) -> asyncio.Protocol:
        conn = H2Connection(
            self.open_stream,
            max_streams=self.config.max_streams,
            max_message=self.state.config.server.max_body_bytes + (1 << 20),
            limits=self.limits,
            pool=self.pool,
            turn=self.turn,
            overdrawn_turn=self.overdrawn_turn,
            on_close=self._closed,
        )
        self.connections.add(conn)
        self.listener.open = len(self.connections)
        return conn

    def _closed(self, conn: H2Connection) -> None:
        self.connections.discard(conn)
        self.listener.open = len(self.connections)
        if conn.error_code:  # a budget crossed, or a protocol error Envoy would never make
            self.listener.strike(conn.peer_host, time.monotonic())

    async def start(self) -> int:
        cfg = self.config
        tls = None
        if cfg.tls_cert and cfg.tls_key:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(cfg.tls_cert, cfg.tls_key)
            tls.set_alpn_protocols(["h2"])
            if cfg.tls_client_ca:  # mTLS: no handshake without a certificate the CA signed
                tls.verify_mode = ssl.CERT_REQUIRED
                tls.load_verify_locations(cfg.tls_client_ca)
        loop = asyncio.get_running_loop()
        await self.book.resolve()
        self.listener.tls = tls
        self.port = await self.listener.start(cfg.host, cfg.port)
        self._tasks.append(loop.create_task(self._sweep()))
        if self.book.unresolved or any(e.config.endpoint is None for e in self.state.engines):
            self._tasks.append(loop.create_task(self.book.keep_resolving()))
        scheme = "grpcs" if tls else "grpc"
        log.info("EPP (ext_proc) listening on %s://%s:%d", scheme, cfg.host, self.port)
        return self.port

    async def _sweep(self) -> None:
        """Once a second: end the streams that owe a message and sent none for
        ``message_timeout_s``; release the slots held past their model's ``total_s``; close
        connections idle (no stream) past ``idle_timeout_s``; finish the requests whose access
        log entry is overdue."""
        cfg = self.config
        while True:
            await asyncio.sleep(_SWEEP_S)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.expire(now, cfg.message_timeout_s, cfg.limits.stall_timeout_s)
                for stream in list(conn.streams.values()):
                    if isinstance(stream.handler, ExtProcStream):
                        stream.handler.overdue(now)
                if not conn.streams and now - conn.last_activity > cfg.idle_timeout_s:
                    conn.shutdown()
            self.endings.expire(now)
            self.listener.forgive(now)

    async def stop(self, grace_s: float = 1.0) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        await self.listener.stop()
        for conn in list(self.connections):
            conn.shutdown()
        waiting = [c.done for c in self.connections if c.done is not None]
        if waiting:
            await asyncio.wait(waiting, timeout=grace_s)
        for conn in list(self.connections):
            conn.close()


EPP: web.AppKey[EppServer] = web.AppKey("specgate_epp", EppServer)


def attach(app: web.Application) -> None:
    """Serve the EPP with ``app`` (call after the app's own start-up hooks are added)."""

    server = app[EPP] = EppServer(app[STATE])

    async def start(app: web.Application) -> None:
        await server.start()

    async def stop(app: web.Application) -> None:
        await server.stop()

    app.on_startup.append(start)
    app.on_cleanup.insert(0, stop)
