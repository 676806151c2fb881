"""``specgate envoy-config``: an Envoy bootstrap that fronts a config's engines, with specgate
as its Endpoint Picker (EPP).

Envoy relays the bytes; for each request its ``ext_proc`` filter asks specgate (gRPC over
cleartext HTTP/2) which engine to use, and specgate answers with the request header and the
dynamic metadata ``envoy.lb`` / ``x-gateway-destination-endpoint`` = ``ip:port`` or
``ip:port,ip:port`` (the pick, then the sibling engine), per the Gateway API Inference
Extension's Endpoint Picker protocol. What the generated bootstrap holds:

- a listener whose HTTP connection manager runs three filters: ``header_mutation`` strips a
  client's own ``x-gateway-destination-endpoint`` (clients never pick engines, not even when
  the EPP is down and the filter fails open), ``ext_proc``, then the router. The ext_proc
  modes: request headers SEND, request body BUFFERED, response headers SKIP, response body
  NONE, trailers SKIP, and ``allow_mode_override``, so that specgate asks for the response
  headers of the answers it watches and the body of a sampled few. Skipping the other
  answers' response phase keeps a round trip to specgate off every response, and a message
  pair off its CPU. STREAMED with ``send_body_without_waiting_for_header_response`` saves
  the request headers' round trip, but Envoy then ignores mode overrides, so no answer
  could be watched: with ``watch_share`` the bootstrap splits the requests between both
  filters (:mod:`.filters`), a share watched and the rest in one round trip;
- one route, ``/`` to the cluster ``engines``, without a timeout (answers stream), retrying
  once on a connect failure, a refused stream or a reset before the request went out: the
  override-host policy then takes the next endpoint of the EPP's list, the sibling engine.
  It adds ``x-specgate-route`` / ``-reason`` / ``-engine`` to each answer from specgate's
  dynamic metadata (specgate overwrites them on a watched answer that failed over), and the
  connection manager returns the request's ``x-request-id``;
- the cluster ``engines``: every engine of every model, the plain (``base``) engines at
  priority 0 and the speculative ones at priority 1, load-balanced by ``override_host``
  (the header's endpoints, then the metadata's: specgate sets both, so a one-endpoint pick
  is retried on that endpoint) with ``round_robin`` as the fallback. The fallback runs only
  without a pick (the EPP down and the filter failing open) or with its list used up, and
  then the priorities send the traffic to the plain engines while their ``/health``
  answers. The pick itself ignores priorities and health: the EPP decides. The engine that
  served goes back to specgate as ``envoy.lb`` / ``x-gateway-destination-endpoint-served``
  with the response headers of the answers it watches;
- the cluster ``specgate_epp`` (HTTP/2) at the EPP's address.

Engine addresses: an engine's ``endpoint`` if set, else its url's host and port. Where every
address is an IP literal the cluster is STATIC. Where one is a host name the cluster is
STRICT_DNS (IPv4 preferred) and Envoy resolves the names itself: specgate must then name
each engine by the address Envoy resolved, so give ``endpoint: ip:port`` to engines whose
names could resolve differently for the two (several addresses, IPv4 and IPv6).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.config.models import EngineConfig, GatewayConfig
from gateway.envoy.accesslog import grpc_access_log
from gateway.envoy.eppauth import add_token, tls_socket
from gateway.envoy.filters import (
    EPP_CLUSTER,
    LB_NAMESPACE,
    SPECGATE_NAMESPACE,
    duration,
    ext_proc_filters,
    share_routes,
    typed,
)

__all__ = ["EPP_CLUSTER", "LB_NAMESPACE", "SPECGATE_NAMESPACE", "envoy_config"]

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
ENGINES_CLUSTER = "engines"
PLAIN_PRIORITY = 0
SPEC_PRIORITY = 1
RETRY_ON = "connect-failure,refused-stream,reset-before-request"
EPP_CONNECT_TIMEOUT_S = 0.5
# Envoy's default circuit breakers (1024 requests, 3 retries in flight per cluster) would cap
# concurrent streams far below what the engines and specgate take; specgate limits load itself.
CIRCUIT_LIMIT = 100_000
ACCESS_LOG_FLUSH_S = 0.1  # how long Envoy batches the access log it streams to specgate

# One JSON line per request on Envoy's stdout: what specgate picked, what served it.
ACCESS_LOG_FORMAT = {
    "start": "%START_TIME%",
    "method": "%REQ(:METHOD)%",
    "path": "%REQ(:PATH)%",
    "status": "%RESPONSE_CODE%",
    "flags": "%RESPONSE_FLAGS%",
    "picked": f"%DYNAMIC_METADATA({LB_NAMESPACE}:{DESTINATION})%",
    "route": f"%DYNAMIC_METADATA({SPECGATE_NAMESPACE}:route)%",
    "reason": f"%DYNAMIC_METADATA({SPECGATE_NAMESPACE}:reason)%",
    "upstream": "%UPSTREAM_HOST%",
    "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
    "duration_ms": "%DURATION%",
}


@dataclass(frozen=True)
class EngineEndpoint:
    """Where the ``engines`` cluster reaches one engine."""

    engine: str
    model: str
    role: str  # "spec" or "base"
    host: str  # an IP literal (IPv6 without brackets) or a host name
    port: int

    @property
    def priority(self) -> int:
        return SPEC_PRIORITY if self.role == "spec" else PLAIN_PRIORITY

    @property
    def is_ip(self) -> bool:
        return _is_ip(self.host)

    @property
    def address(self) -> str:
        """``ip:port`` as Envoy names the host (IPv6 in brackets): what the EPP must send."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def engine_endpoint(engine: EngineConfig, *, model: str, role: str) -> EngineEndpoint:
    """The address of ``engine``: its ``endpoint`` if set, else its url's host and port."""
    url = urlsplit(engine.url)
    if url.scheme != "http":
        raise ValueError(
            f"engine {engine.name!r}: the generated Envoy config speaks plain HTTP to the engines, "
            f"but its url is {engine.url!r}"
        )
    if url.path not in ("", "/"):
        raise ValueError(
            f"engine {engine.name!r}: its url {engine.url!r} has a path, but Envoy forwards the "
            "client's path unchanged; serve the engine at the root of its host:port"
        )
    if engine.endpoint is not None:
        host, _, port_text = engine.endpoint.rpartition(":")
        host, port = host.strip("[]"), int(port_text)
    elif url.hostname is None:  # pragma: no cover - the config's url validator requires a host
        raise ValueError(f"engine {engine.name!r}: no host in {engine.url!r}")
    else:
        host, port = url.hostname, url.port or 80
    _check_port(f"engine {engine.name!r}'s port", port)
    if _is_ip(host):
        host = str(ipaddress.ip_address(host))  # as Envoy writes it: fd00:0::1 -> fd00::1
    return EngineEndpoint(engine.name, model, role, host, port)


def engine_endpoints(cfg: GatewayConfig) -> list[EngineEndpoint]:
    """Every engine of every model, plain ones first; an address may serve one engine only."""
    out: list[EngineEndpoint] = []
    for model in cfg.models:
        for pair in model.pairs:
            out.append(engine_endpoint(pair.base, model=model.name, role="base"))
            if pair.spec is not None:
                out.append(engine_endpoint(pair.spec, model=model.name, role="spec"))
    seen: dict[tuple[str, int], str] = {}
    for ep in out:
        key = (ep.host.lower(), ep.port)
        if key in seen:
            raise ValueError(
                f"engines {seen[key]!r} and {ep.engine!r} share the address {ep.address}: the "
                "Endpoint Picker names engines by address, so each needs its own"
            )
        seen[key] = ep.engine
    return sorted(out, key=lambda ep: ep.priority)


def _socket_address(host: str, port: int) -> dict[str, Any]:
    return {"address": {"socket_address": {"address": host, "port_value": port}}}


def _check_port(what: str, port: int, *, allow_zero: bool = False) -> None:
    if not (0 if allow_zero else 1) <= port <= 65535:
        raise ValueError(f"{what} must be a TCP port, got {port}")


def _engines_cluster(cfg: GatewayConfig) -> dict[str, Any]:
    endpoints = engine_endpoints(cfg)
    by_priority: dict[int, list[dict[str, Any]]] = {}
    for ep in endpoints:
        by_priority.setdefault(ep.priority, []).append(
            {
                "endpoint": _socket_address(ep.host, ep.port),
                # For access logs and /clusters: which engine an address is.
                "metadata": {
                    "filter_metadata": {
                        SPECGATE_NAMESPACE: {"engine": ep.engine, "model": ep.model, "role": ep.role}
                    }
                },
            }
        )
    dns = not all(ep.is_ip for ep in endpoints)
    connect_s = min(m.timeouts.connect_s for m in cfg.models)
    cluster: dict[str, Any] = {
        "name": ENGINES_CLUSTER,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connect_timeout": duration(connect_s),
    }
    if dns:
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    cluster |= {
        "load_balancing_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.override_host",
                        "typed_config": typed(
                            "extensions.load_balancing_policies.override_host.v3.OverrideHost",
                            override_host_sources=[
                                {"header": DESTINATION},
                                {"metadata": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION}]}},
                            ],
                            # The engine that served the request (after a retry: the sibling), for
                            # the EPP with the response headers (metadata_options below).
                            selected_host_key={"key": LB_NAMESPACE, "path": [{"key": SERVED}]},
                            fallback_policy={
                                "policies": [
                                    {
                                        "typed_extension_config": {
                                            "name": "envoy.load_balancing_policies.round_robin",
                                            "typed_config": typed(
                                                "extensions.load_balancing_policies.round_robin.v3.RoundRobin"
                                            ),
                                        }
                                    }
                                ]
                            },
                        ),
                    }
                }
            ]
        },
        # Only the fallback (no pick) reads health: the plain engines while they answer.
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "5s",
                "no_traffic_interval": "5s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "http_health_check": {"path": "/health"},
            }
        ],
        "circuit_breakers": {"thresholds": [_circuit_limits()]},
        "load_assignment": {
            "cluster_name": ENGINES_CLUSTER,
            "endpoints": [
                {"priority": priority, "lb_endpoints": lb_endpoints}
                for priority, lb_endpoints in sorted(by_priority.items())
            ],
        },
    }
    return cluster


def _circuit_limits() -> dict[str, Any]:
    return {
        "max_connections": CIRCUIT_LIMIT,
        "max_pending_requests": CIRCUIT_LIMIT,
        "max_requests": CIRCUIT_LIMIT,
        "max_retries": CIRCUIT_LIMIT,
    }


def _epp_cluster(epp_host: str, epp_port: int) -> dict[str, Any]:
    dns = not _is_ip(epp_host)
    cluster: dict[str, Any] = {
        "name": EPP_CLUSTER,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connect_timeout": duration(EPP_CONNECT_TIMEOUT_S),
    }
    if dns:
        cluster["dns_lookup_family"] = "V4_PREFERRED"
    cluster |= {
        # gRPC: HTTP/2 without TLS (h2c).
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": typed(
                "extensions.upstreams.http.v3.HttpProtocolOptions",
                explicit_http_config={"http2_protocol_options": {}},
            )
        },
        # One ext_proc stream per request in flight.
        "circuit_breakers": {"thresholds": [_circuit_limits()]},
        "load_assignment": {
            "cluster_name": EPP_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": _socket_address(epp_host, epp_port)}]}],
        },
    }
    return cluster


def envoy_config(
    cfg: GatewayConfig,
    *,
    listen_host: str = "127.0.0.1",
    listen_port: int = 8080,
    epp_host: str = "127.0.0.1",
    epp_port: int = 9002,
    fail_open: bool = False,
    admin_port: int | None = None,
    message_timeout_s: float = 10.0,
    watch_share: float | None = None,
    access_log: bool = False,
    epp_tls: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """An Envoy bootstrap (dump it with ``yaml.safe_dump``) that fronts the engines of ``cfg``
    with specgate at ``epp_host:epp_port`` as Endpoint Picker. ``fail_open``: without an
    answer from specgate, requests go on to the plain engines (round robin) instead of
    failing with 500. ``watch_share``: the split layout (:mod:`.filters`), this share of
    the requests on the watched path and the rest on one round trip. ``access_log``: Envoy
    streams every request's access log entry to specgate, which then knows how each one
    ended (:mod:`gateway.api.epp.endings`). ``cfg.epp.auth_token``: every stream to the EPP
    carries it; ``epp_tls`` (Envoy's client certificate, its key, the CA of specgate's):
    Envoy reaches the EPP over mTLS (:mod:`.eppauth`). Raises ValueError
    for what the config cannot express (an https engine, an engine url with a path, two
    engines on one address, a share outside [0, 1])."""
    _check_port("listen_port", listen_port, allow_zero=True)
    _check_port("epp_port", epp_port)
    if admin_port is not None:
        _check_port("admin_port", admin_port, allow_zero=True)
    if not 0.0 < message_timeout_s <= 3600.0:
        raise ValueError(f"message_timeout_s must be in (0, 3600], got {message_timeout_s}")

    route = {
        "match": {"prefix": "/"},
        "route": {
            "cluster": ENGINES_CLUSTER,
            "timeout": "0s",  # answers stream for as long as they take
            # A connect failure, a refused stream or a reset before the request went out
            # moves to the next endpoint of the EPP's list: the sibling engine.
            "retry_policy": {"retry_on": RETRY_ON, "num_retries": 1},
        },
        # The EPP reads whole request bodies (BUFFERED), and a retry resends one: as large as
        # specgate takes (Envoy's default, 1 MiB, would answer 413 to longer prompts).
        "request_body_buffer_limit": cfg.server.max_body_bytes,
        # The decision, on every answer: from specgate's metadata (no header where it set none,
        # as for an answer Envoy gave itself).
        "response_headers_to_add": [
            {
                "header": {
                    "key": f"x-specgate-{tag}",
                    "value": f"%DYNAMIC_METADATA({SPECGATE_NAMESPACE}:{tag})%",
                },
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
            for tag in ("route", "reason", "engine")
        ],
    }
    hcm = typed(
        "extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="specgate",
        codec_type="AUTO",
        always_set_request_id_in_response=True,
        access_log=[
            {
                "name": "envoy.access_loggers.stdout",
                "typed_config": typed(
                    "extensions.access_loggers.stream.v3.StdoutAccessLog",
                    log_format={"json_format": ACCESS_LOG_FORMAT},
                ),
            },
            *([grpc_access_log(flush_s=ACCESS_LOG_FLUSH_S)] if access_log else []),
        ],
        route_config={
            "name": "specgate",
            "virtual_hosts": [
                {"name": "engines", "domains": ["*"], "routes": share_routes(route, watch_share)}
            ],
        },
        http_filters=[
            {
                # Clients never pick the engine: only the EPP sets this header.
                "name": "envoy.filters.http.header_mutation",
                "typed_config": typed(
                    "extensions.filters.http.header_mutation.v3.HeaderMutation",
                    mutations={"request_mutations": [{"remove": DESTINATION}]},
                ),
            },
            *ext_proc_filters(
                fail_open=fail_open,
                message_timeout_s=message_timeout_s,
                split=watch_share is not None,
                max_body_bytes=cfg.server.max_body_bytes,
            ),
            {
                "name": "envoy.filters.http.router",
                "typed_config": typed("extensions.filters.http.router.v3.Router"),
            },
        ],
    )
    bootstrap: dict[str, Any] = {
        "static_resources": {
            "listeners": [
                {
                    "name": "specgate",
                    **_socket_address(listen_host, listen_port),
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [_engines_cluster(cfg), _epp_cluster(epp_host, epp_port)],
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": typed(
                        "extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                        max_active_downstream_connections=cfg.server.max_connections,
                    ),
                }
            ]
        },
    }
    if admin_port is not None:
        bootstrap["admin"] = _socket_address("127.0.0.1", admin_port)
    if cfg.epp.auth_token is not None:
        add_token(bootstrap, cfg.epp.auth_token.get_secret_value())
    if epp_tls is not None:
        cert, key, ca = epp_tls
        epp = bootstrap["static_resources"]["clusters"][1]
        epp["transport_socket"] = tls_socket(cert=cert, key=key, ca=ca, sni=epp_host)
    return bootstrap
