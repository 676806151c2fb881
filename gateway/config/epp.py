"""The ``epp:`` section of the gateway config: specgate as an Endpoint Picker.

In this mode an Envoy-based gateway (Envoy Gateway, kgateway, Istio, llm-d) relays the
bytes and asks specgate, over Envoy's ``ext_proc`` gRPC protocol, which engine each
request goes to (the Gateway API Inference Extension's Endpoint Picker protocol). The
HTTP port keeps serving ``/metrics``, ``/admin/*``, ``/health`` and ``/ready``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator


class FrameBudget(BaseModel):
    """A token bucket: ``rate`` frames a second on average, ``burst`` at once."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(gt=0.0, le=1e7, description="frames a second, sustained")
    burst: float = Field(ge=1.0, le=1e7, description="frames at once (the bucket's size)")


def _budget(rate: float, burst: float, what: str) -> Any:
    return Field(
        default_factory=lambda: FrameBudget(rate=rate, burst=burst),
        description=f"per connection: {what}; crossing it ends the connection with GOAWAY ENHANCE_YOUR_CALM",
    )


class EppLimits(BaseModel):
    """What one HTTP/2 peer may cost the EPP: frame-rate budgets and memory bounds (see
    docs/epp-security.md). The defaults sit far above what Envoy's ext_proc client sends and
    far below what a flood does."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    ping: FrameBudget = _budget(10, 100, "PING frames")
    settings: FrameBudget = _budget(10, 100, "SETTINGS frames")
    early_reset: FrameBudget = _budget(
        200, 400, "RST_STREAMs on streams not answered yet (rapid reset), and streams opened past max_streams"
    )
    continuation: FrameBudget = _budget(100, 200, "CONTINUATION frames")
    window_update: FrameBudget = _budget(1000, 2000, "WINDOW_UPDATE frames")
    empty: FrameBudget = _budget(100, 500, "empty DATA/HEADERS/CONTINUATION frames that end nothing")
    streams: FrameBudget = _budget(20_000, 5000, "new streams")
    other: FrameBudget = _budget(
        100, 500, "PRIORITY, GOAWAY, unknown frames and RST_STREAM on closed streams"
    )
    stream_memory_bytes: int = Field(
        10 << 20,
        ge=1 << 16,
        description="bytes one stream may hold (a message in parts, a body in pieces, answers waiting "
        "for the peer's window); raised to the largest message (server.max_body_bytes + 1 MiB)",
    )
    connection_memory_bytes: int = Field(
        32 << 20, ge=1 << 16, description="the same, summed over one connection's streams"
    )
    process_memory_bytes: int = Field(
        64 << 20,
        ge=1 << 20,
        description="the same, summed over every EPP connection: a stream that would take more is ended "
        "(RESOURCE_EXHAUSTED); raise it for many concurrent multi-MB bodies",
    )
    connection_window_bytes: int = Field(
        16 << 20,
        ge=65_536,
        le=(1 << 31) - 1,
        description="the HTTP/2 receive window of a connection, granted again only for what was consumed "
        "(at least the largest message)",
    )
    stream_window_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=(1 << 31) - 1,
        description="the initial HTTP/2 receive window of a stream (grown to the message announced)",
    )
    write_buffer_bytes: int = Field(
        1 << 20, ge=1 << 12, description="output queued for a peer above which its input is not read"
    )
    stall_timeout_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="abort a connection whose peer has not read its output this long"
    )
    slice_ms: float = Field(
        0.25,
        gt=0.0,
        le=1000.0,
        description="the longest the EPP's frames hold the event loop in one turn of it, all its "
        "connections together (the rest waits for the loop's other work: the HTTP gateway, health "
        "checks), milliseconds: a gateway request whose path crosses k turns of the loop waits at "
        "most k slices for the EPP (0.25: 16 flooding connections left chat p99 within 1.2x on a "
        "16-core host, 1 ms did not; docs/epp-security.md)",
    )
    overdrawn_share: float = Field(
        0.1,
        gt=0.0,
        le=1.0,
        description="the fraction of the event loop's time that connections which had a stream ended "
        "for memory (RESOURCE_EXHAUSTED: they announced more than the EPP's bounds hold) may take, all "
        "together; their frames wait in a slower line (Envoy within the bounds never gets there)",
    )
    accepts_per_s: float = Field(
        200.0,
        gt=0.0,
        le=1e6,
        description="new EPP connections accepted a second, refused ones included (more wait in the backlog)",
    )
    max_connections: int = Field(
        256, ge=1, le=65_536, description="EPP connections at once; more are closed as they come"
    )

    @model_validator(mode="before")
    @classmethod
    def _budget_defaults(cls, data: Any) -> Any:
        """A budget given in part (``ping: {rate: 5}``, ``SPECGATE_EPP__LIMITS__PING__RATE=5``)
        keeps its default for the other field."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, field in cls.model_fields.items():
            given = out.get(name)
            if isinstance(given, dict) and field.default_factory is not None:
                out[name] = {**field.default_factory().model_dump(), **given}  # type: ignore[call-arg]
        return out


class EppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    enabled: bool = Field(False, description="serve the ext_proc Endpoint Picker (gRPC, HTTP/2) on host:port")
    host: str = Field("127.0.0.1", description="address of the EPP listener (0.0.0.0 for all interfaces)")
    port: int = Field(9002, ge=0, le=65535, description="TCP port of the EPP listener (0 picks a free one)")
    observe_per_s: float = Field(
        20.0,
        ge=0.0,
        le=10_000.0,
        description="answers per second per model whose body the EPP reads (tokens, timing, the "
        "n-gram replay) to learn from; it watches as many a second for each model, counted together "
        "(their response headers asked for: status, the engine that served), and the others cost it "
        "no message after the request's (0: none watched, nothing learned)",
    )
    max_streams: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="concurrent ext_proc streams per connection (HTTP/2 setting; Envoy opens another "
        "connection past it)",
    )
    limits: EppLimits = Field(default_factory=EppLimits, description="budgets and memory bounds per peer")
    auth_token: SecretStr | None = Field(
        None,
        description="shared secret: every gRPC stream must carry 'authorization: Bearer <token>' (the "
        "bootstrap of `specgate envoy-config` sets it as the ext_proc service's initial metadata); "
        "others get UNAUTHENTICATED (grpc.health.v1, readiness only, stays open to probes)",
    )
    tls_client_ca: str | None = Field(
        None,
        description="PEM CA bundle: require TLS client certificates signed by it (mTLS; needs tls_cert)",
    )
    idle_timeout_s: float = Field(
        300.0, gt=0.0, le=86_400.0, description="close an Envoy connection with no stream open this long"
    )
    message_timeout_s: float = Field(
        60.0,
        gt=0.0,
        le=86_400.0,
        description="a stream that owes a message (its request not yet routed: a body never finished) "
        "and sends none this long is ended; a routed request's stream lasts as long as its response "
        "(the request's slot is released after its model's timeouts.total_s)",
    )
    tls_cert: str | None = Field(None, description="PEM certificate: serve the EPP over TLS (ALPN h2)")
    tls_key: str | None = Field(None, description="PEM private key for tls_cert")

    @model_validator(mode="after")
    def _tls_pair(self) -> EppConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("epp.tls_cert and epp.tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("epp.tls_client_ca needs epp.tls_cert and epp.tls_key (mTLS is TLS)")
        if self.auth_token is not None and len(self.auth_token.get_secret_value()) < 16:
            raise ValueError("epp.auth_token: at least 16 characters")
        return self

    @property
    def authenticates(self) -> bool:
        """Whether the EPP knows who its peer is (a shared secret, or client certificates)."""
        return self.auth_token is not None or self.tls_client_ca is not None
