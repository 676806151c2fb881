"""``GET /v1/models`` (and one model: ``/v1/models/{model}``), ``/health``, ``/ready`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp import web

from gateway.api.auth import bearer_token, check_client, is_admin, key_matches, may_see_model
from gateway.api.model_cards import engine_fields
from gateway.api.state import STATE, GatewayState
from gateway.engines.runtime import EngineRuntime
from gateway.wire.errors import ApiError

READY_CACHE_S = 1.0


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(data).encode(), content_type="application/json")


async def _model_cards(request: web.Request) -> list[dict[str, object]]:
    """The cards of the models this client may see (its key checked where keys are set)."""
    st = request.app[STATE]
    server_keys = st.config.server.api_keys
    if server_keys:
        check_client(request, st.client_keys)
    created = int(st.started_at)
    visible = [m for m in st.models.values() if may_see_model(request, server_keys, m.config.api_keys)]
    fields = await engine_fields(st) if visible else {}
    return [
        {
            "id": m.name,
            "object": "model",
            "created": created,
            "owned_by": "specgate",
            **fields.get(m.name, {}),
        }
        for m in visible
    ]


async def list_models(request: web.Request) -> web.Response:
    return _json({"object": "list", "data": await _model_cards(request)})


async def get_model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}``, OpenAI's retrieve (the SDK's ``models.retrieve``): the
    model's card, or 404 ``model_not_found`` for a model unknown or not this key's."""
    name = request.match_info["model"]
    for card in await _model_cards(request):
        if card["id"] == name:
            return _json(card)
    raise ApiError(
        404,
        f"The model '{name[:200]}' does not exist",
        param="model",
        code="model_not_found",
    )


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def _probe(st: GatewayState, rt: EngineRuntime, timeout_s: float) -> bool:
    if rt.draining or not rt.healthy():
        return False
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with st.pool.control(rt.name).get(rt.config.url + "/health", timeout=timeout) as resp:
            await resp.read()
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


def _names_visible(request: web.Request, st: GatewayState) -> bool:
    """Model and engine names are shown to admins, or to anyone when no key is configured
    (``GET /v1/models`` lists them then anyway)."""
    return not st.client_keys or is_admin(request, st.config.server)


async def ready(request: web.Request) -> web.Response:
    """200 when every model has at least one engine that answers ``GET /health``; the
    per-model detail only for :func:`_names_visible`."""
    st = request.app[STATE]
    if st.draining:
        return _json({"status": "draining", "models": {}}, 503)
    now = time.monotonic()
    cached = st.ready_cache
    if cached is None or now - cached[0] > READY_CACHE_S:
        engines = st.engines
        timeout = min(2.0, st.config.scrape.timeout_s * 2)
        results = await asyncio.gather(*(_probe(st, rt, timeout) for rt in engines))
        up = {rt.name: ok for rt, ok in zip(engines, results, strict=True)}
        models: dict[str, object] = {}
        all_ok = True
        for name, m in st.models.items():
            reachable = [e for e in m.engines if up.get(e)]
            models[name] = {"ready": bool(reachable), "engines": {e: up.get(e, False) for e in m.engines}}
            all_ok &= bool(reachable)
        cached = st.ready_cache = (now, all_ok, models)
    _, ok, detail = cached
    out: dict[str, object] = {"status": "ready" if ok else "not_ready"}
    if _names_visible(request, st):
        out["models"] = detail
    return _json(out, 200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    server = st.config.server
    require = server.metrics_require_key
    if require is None:  # default: labels name models, so hide them when models have own keys
        require = st.tenant_keys
    if require:
        token = bearer_token(request)
        if not (key_matches(token, server.api_keys) or key_matches(token, server.admin_keys)):
            raise ApiError(401, "GET /metrics needs a server API key or an admin key", code="invalid_api_key")
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    registry = getattr(st.telemetry, "registry", None) or REGISTRY
    body = generate_latest(registry)
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp
