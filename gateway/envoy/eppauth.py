"""How the Envoy bootstrap proves itself to specgate's EPP (``epp.auth_token``, mTLS).

- The shared secret: every gRPC service of the bootstrap that reaches the EPP's cluster
  (the ext_proc filters, the gRPC access log) sends ``authorization: Bearer <token>`` as
  its initial metadata (``grpc_service.initial_metadata``), on every stream it opens.
- mTLS: the EPP's cluster speaks TLS (ALPN h2) with Envoy's client certificate, and checks
  specgate's certificate against a CA.
"""

from __future__ import annotations

from typing import Any

from gateway.envoy.filters import EPP_CLUSTER, typed

HEADER = "authorization"


def add_token(node: Any, token: str) -> int:
    """Give every ``grpc_service`` under ``node`` that reaches the EPP the shared secret as
    initial metadata; how many were given it."""
    n = 0
    if isinstance(node, dict):
        svc = node.get("grpc_service")
        if isinstance(svc, dict) and svc.get("envoy_grpc", {}).get("cluster_name") == EPP_CLUSTER:
            svc["initial_metadata"] = [{"key": HEADER, "value": f"Bearer {token}"}]
            n += 1
        for v in node.values():
            n += add_token(v, token)
    elif isinstance(node, list):
        for v in node:
            n += add_token(v, token)
    return n


def tls_socket(*, cert: str, key: str, ca: str, sni: str) -> dict[str, Any]:
    """The EPP cluster's transport socket: TLS with Envoy's client certificate (mTLS)."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": typed(
            "extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            sni=sni,
            common_tls_context={
                "alpn_protocols": ["h2"],
                "tls_certificates": [
                    {"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}
                ],
                "validation_context": {"trusted_ca": {"filename": ca}},
            },
        ),
    }
