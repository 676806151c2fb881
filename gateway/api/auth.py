"""API-key checks (constant time) for clients and admins."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping, Sequence
from typing import Protocol

from aiohttp import web
from pydantic import SecretStr

from gateway.config.models import ServerConfig
from gateway.routing.config import RoutingConfig
from gateway.wire.errors import ApiError
from gateway.wire.headers import PROXY_HEADERS, ROUTE


class HasHeaders(Protocol):
    """What the key checks read of a request: its headers (an aiohttp request, or the
    Endpoint Picker's view of the request Envoy forwards)."""

    @property
    def headers(self) -> Mapping[str, str]: ...


def bearer_token(request: HasHeaders) -> str | None:
    value = request.headers.get("Authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def key_matches(token: str | None, keys: Sequence[SecretStr]) -> bool:
    """True when ``token`` equals one of ``keys``; compares against every key, in constant time."""
    if token is None:
        return False
    given = token.encode("utf-8", "surrogateescape")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.get_secret_value().encode("utf-8"))
    return ok


def check_client(request: HasHeaders, keys: Sequence[SecretStr]) -> None:
    if not keys:
        return
    token = bearer_token(request)
    if not key_matches(token, keys):
        msg = "missing API key: send 'Authorization: Bearer <key>'" if token is None else "invalid API key"
        raise ApiError(
            401, msg, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="specgate"'}
        )


def is_loopback(request: web.Request) -> bool:
    """The peer's address is a loopback address."""
    remote = request.remote
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def is_loopback_host(host: str) -> bool:
    """A listen address that only this host can reach (``127.0.0.0/8``, ``::1``, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[] ")).is_loopback
    except ValueError:
        return False


def proxied(request: HasHeaders) -> bool:
    """The request carries a header a proxy adds (``Forwarded``, ``X-Forwarded-*``,
    ``X-Real-IP``, ``Via`` ...): its loopback peer may be relaying someone else."""
    return any(name in request.headers for name in PROXY_HEADERS)


def admin_open(server: ServerConfig) -> bool:
    """Admin endpoints answer without a key: no admin key is configured and the listener
    is bound to loopback (then :func:`check_admin` still wants a loopback peer and no
    proxy header)."""
    return not server.admin_keys and is_loopback_host(server.host)


def _keyless_admin(request: web.Request, server: ServerConfig) -> bool:
    return admin_open(server) and is_loopback(request) and not proxied(request)


def check_admin(request: web.Request, server: ServerConfig) -> None:
    """Admin endpoints need an admin key. With none configured they answer only when the
    listener is bound to loopback, the peer is on loopback and no proxy header says the
    peer relays another client (a reverse proxy on the same host would otherwise open
    them to everyone it serves)."""
    if server.admin_keys:
        if not key_matches(bearer_token(request), server.admin_keys):
            raise ApiError(401, "admin endpoints need an admin key", code="invalid_api_key")
        return
    if not _keyless_admin(request, server):
        raise ApiError(
            403,
            "admin endpoints need an admin key; without one they answer only direct loopback "
            "clients of a gateway listening on loopback",
            code="forbidden",
        )


def is_admin(request: web.Request, server: ServerConfig) -> bool:
    """What :func:`check_admin` lets through, as a test."""
    if server.admin_keys:
        return key_matches(bearer_token(request), server.admin_keys)
    return _keyless_admin(request, server)


def may_override_route(request: HasHeaders, routing: RoutingConfig) -> bool:
    """Whether this request's ``x-specgate-route`` header is honoured: only where the
    model's ``routing.allow_client_override`` is on and, when ``routing.override_keys``
    lists keys, only for a request bearing one of them. (An operator's pin,
    ``POST /admin/route``, still wins: see :func:`gateway.routing.rules.apply_hard_rules`.)"""
    if not routing.allow_client_override or ROUTE not in request.headers:
        return False
    if not routing.override_keys:
        return True
    return key_matches(bearer_token(request), routing.override_keys)


def check_model_access(
    request: HasHeaders,
    name: str,
    model_keys: Sequence[SecretStr] | None,
    server_keys: Sequence[SecretStr],
    client_keys: Sequence[SecretStr],
) -> None:
    """May this request use model ``name`` (``model_keys`` None: no such model)?

    Server keys may use every model; a model's own keys only that model; a model without
    keys of its own is open when there are no server keys. When any key is configured,
    the answer never tells which models exist: a request without a valid key gets the
    same 401 whatever the model, a valid key that may not use the model the same 404 as
    an unknown model. Without any key configured every model is open (unknown ones are
    the caller's 404).
    """
    if not client_keys:
        return
    token = bearer_token(request)
    valid = key_matches(token, client_keys)
    if model_keys is not None:
        if not server_keys and not model_keys:
            return
        if key_matches(token, [*server_keys, *model_keys]):
            return
    if not valid:
        raise ApiError(
            401,
            "missing API key: send 'Authorization: Bearer <key>'" if token is None else "invalid API key",
            code="invalid_api_key",
            headers={"WWW-Authenticate": 'Bearer realm="specgate"'},
        )
    raise ApiError(
        404,
        f"The model '{name[:200]}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def may_see_model(
    request: web.Request, server_keys: Sequence[SecretStr], model_keys: Sequence[SecretStr]
) -> bool:
    if not server_keys and not model_keys:
        return True
    token = bearer_token(request)
    return key_matches(token, server_keys) or key_matches(token, model_keys)
