"""The ``epp:`` section of the gateway config: specgate as an Endpoint Picker.

In this mode an Envoy-based gateway (Envoy Gateway, kgateway, Istio, llm-d) relays the
bytes and asks specgate, over Envoy's ``ext_proc`` gRPC protocol, which engine each
request goes to (the Gateway API Inference Extension's Endpoint Picker protocol). The
HTTP port keeps serving ``/metrics``, ``/admin/*``, ``/health`` and ``/ready``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
        4096, ge=1, le=1_000_000, description="concurrent ext_proc streams per connection (HTTP/2 setting)"
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
        return self
