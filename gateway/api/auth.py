"""API-key checks (constant time) for clients and admins."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence

from aiohttp import web
from pydantic import SecretStr

from gateway.api.errors import ApiError


def bearer_token(request: web.Request) -> str | None:
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


def check_client(request: web.Request, keys: Sequence[SecretStr]) -> None:
    if not keys:
        return
    token = bearer_token(request)
    if not key_matches(token, keys):
        msg = "missing API key: send 'Authorization: Bearer <key>'" if token is None else "invalid API key"
        raise ApiError(
            401, msg, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="specgate"'}
        )


def is_loopback(request: web.Request) -> bool:
    remote = request.remote
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False


def check_admin(request: web.Request, admin_keys: Sequence[SecretStr]) -> None:
    """Admin endpoints need an admin key; with none configured, only loopback clients pass."""
    if admin_keys:
        if not key_matches(bearer_token(request), admin_keys):
            raise ApiError(401, "admin endpoints need an admin key", code="invalid_api_key")
        return
    if not is_loopback(request):
        raise ApiError(
            403,
            "admin endpoints are served to loopback clients only when no admin key is configured",
            code="forbidden",
        )
