"""Admin endpoints: ``GET /admin/state``, ``GET /admin/advice``, ``POST /admin/route``,
``POST /admin/drain`` and ``POST /admin/reload``.

All need an admin key (``server.admin_keys``, separate from client keys). When no
admin key is configured they answer only a gateway listening on loopback, to loopback
clients that no proxy header marks as relayed (403 for anyone else; see
:func:`gateway.api.auth.check_admin` and ``docs/security.md``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from gateway.advisor.report import advice_dict, measured_dict
from gateway.api.auth import check_admin
from gateway.api.epp.server import EPP
from gateway.api.features import parse_json
from gateway.api.state import STATE
from gateway.config.models import ServerConfig
from gateway.fleet.reload import Reloader
from gateway.proxy.move import Asked
from gateway.routing.steptime import get_step_model
from gateway.routing.types import ModelView, RouteOverride
from gateway.telemetry.pairs import regimes
from gateway.wire.errors import ApiError


async def state(request: web.Request) -> web.Response:
    st = request.app[STATE]
    check_admin(request, st.config.server)
    now = time.monotonic()
    models = {name: m.state(now) for name, m in st.models.items()}
    for name, m in models.items():
        _pair_regimes(m, st.models[name].view(now))
        if st.fleet is not None:
            m["fleet"] = st.fleet.state(name)
        found = st.discovery.state(name) if st.discovery is not None else None
        if found is not None:
            m["discovery"] = found
    body = {
        "inflight": st.inflight,
        "max_concurrency": st.config.server.max_concurrency,
        "uptime_s": round(time.time() - st.started_at, 3),
        "models": models,
        "config": reload_state(st.reloader),
    }
    if st.peers is not None:
        body["peers"] = st.peers.state()
    epp = request.app.get(EPP)
    if epp is not None:
        body["epp"] = epp.admin_state()
    return web.Response(body=json.dumps(body, default=str).encode(), content_type="application/json")


def _pair_regimes(model: dict[str, Any], view: ModelView) -> None:
    """Each pair's regime (``speculating``; None: draining, or not known yet) and load as
    placement counts them (the ``specgate_pair_*`` series), beside its engines' state."""
    snapshot = model.get("policy_state")
    regime = regimes(view, snapshot if isinstance(snapshot, dict) else {})
    load = {p.base.name: round(sum(e.load for e in p.engines), 3) for p in view.pairs}
    for pair in model.get("pairs", ()):
        base = pair.get("base") or {}
        pair["speculating"] = regime.get(base.get("name", ""))
        pair["load"] = load.get(base.get("name", ""))


ADVICE_LOADS = (1.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
_MAX_LOADS = 16


async def advice(request: web.Request) -> web.Response:
    """What an n-gram (or suffix) speculative engine would buy on the traffic so far, per
    model (:mod:`gateway.advisor`): the sampled answers replayed with the model's n-gram
    settings and a suffix proposer's, both engines priced on its routing profile at
    ``?loads=1,8,64`` (requests in flight; default 1-128) and at the load it carries now,
    and under ``measured`` the plain answers' own time per token with the prediction
    scaled to it."""
    st = request.app[STATE]
    check_admin(request, st.config.server)
    loads = _loads(request.query.get("loads"))
    body: dict[str, Any] = {}
    for name, m in st.models.items():
        adv = st.advice.get(name)
        if adv is None or adv.requests == 0:
            body[name] = {"requests": 0}
            continue
        profile = m.config.routing.profile
        steps = get_step_model(profile, max(1, round(adv.ngram.total.context_tokens)))
        now = float(max(1, m.inflight))
        out = advice_dict(adv, steps, sorted({*loads, now}), profile)
        out["in_flight_now"] = now
        out["measured"] = measured_dict(adv, steps)
        body[name] = out
    return web.Response(body=json.dumps(body).encode(), content_type="application/json")


def _loads(raw: str | None) -> tuple[float, ...]:
    if raw is None:
        return ADVICE_LOADS
    try:
        loads = tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        loads = ()
    if not loads or len(loads) > _MAX_LOADS or not all(1.0 <= x <= 4096.0 for x in loads):
        raise ApiError(400, f"loads must be 1 to {_MAX_LOADS} numbers from 1 to 4096", param="loads")
    return loads


ADMIN_BODY_MAX = 64 * 1024


async def _admin_body(request: web.Request, server: ServerConfig) -> dict[str, Any]:
    """Authorise an admin POST, then read and parse its (small) JSON body."""
    check_admin(request, server)
    raw = await request.content.read(ADMIN_BODY_MAX + 1)
    if len(raw) > ADMIN_BODY_MAX:
        raise ApiError(413, "admin request body too large", code="request_too_large")
    return parse_json(raw)


async def set_route(request: web.Request) -> web.Response:
    """Pin a model to ``spec`` or ``base`` (hard rules still apply), or back to ``auto``."""
    st = request.app[STATE]
    body = await _admin_body(request, st.config.server)
    model, route = body.get("model"), body.get("route")
    if not isinstance(model, str) or model not in st.models:
        raise ApiError(404, f"unknown model {str(model)[:200]!r}", param="model", code="model_not_found")
    try:
        pinned = RouteOverride(route) if isinstance(route, str) else None
    except ValueError:
        pinned = None
    if pinned is None:
        raise ApiError(400, "'route' must be one of auto, spec, base", param="route", code="invalid_value")
    previous = st.models[model].pinned
    st.models[model].pinned = pinned
    return web.Response(
        body=json.dumps({"model": model, "route": pinned.value, "previous": previous.value}).encode(),
        content_type="application/json",
    )


async def drain(request: web.Request) -> web.Response:
    """``{"engine": "<name>", "draining": true|false, "move": false}``: stop (or resume)
    sending new requests to an engine, e.g. before restarting it. Requests already on it
    finish there, unless ``move`` is true: then its streams that can continue elsewhere move
    to their sibling engine (as at a regime flip), and the rest finish there. ``moving``
    counts the streams that move now (answering their content, or still queued);
    ``moving_later`` those still thinking (or not yet past their opening chunk), which move
    once their content begins unless they end first (a move mid-reasoning cannot be written
    as a chat message: docs/moves.md)."""
    st = request.app[STATE]
    body = await _admin_body(request, st.config.server)
    name, flag, move = body.get("engine"), body.get("draining", True), body.get("move", False)
    model = next((m for m in st.models.values() if name in m.engines), None)
    if not isinstance(name, str) or model is None:
        raise ApiError(404, f"unknown engine {str(name)[:200]!r}", param="engine", code="engine_not_found")
    if not isinstance(flag, bool):
        raise ApiError(400, "'draining' must be a boolean", param="draining", code="invalid_value")
    if not isinstance(move, bool):
        raise ApiError(400, "'move' must be a boolean", param="move", code="invalid_value")
    engine = model.engines[name]
    pair = model.pair_of(name)
    if pair is not None and pair.leaving and not flag:
        raise ApiError(
            409, f"engine {name} belongs to pair {pair.name}, which is leaving", code="pair_leaving"
        )
    engine.draining = flag
    board = st.moves.get(model.name)
    asked = board.move(engine=name) if move and board is not None else Asked(0, 0)
    out = {
        "engine": name,
        "draining": flag,
        "inflight": engine.inflight,
        "moving": asked.moving,
        "moving_later": asked.later,
    }
    return web.Response(body=json.dumps(out).encode(), content_type="application/json")


def reload_state(reloader: Reloader | None) -> dict[str, object]:
    """The configuration's reload state: whether it can reload, the last outcome, and the
    settings changed since the start that wait for a restart."""
    if reloader is None:
        return {"reloadable": False}
    return {
        "reloadable": True,
        "watched": reloader.source.path is not None and reloader.watching,
        "last_reload": None if reloader.last is None else reloader.last.as_dict(),
        "restart_needed": list(reloader.restart_needed),
    }


async def reload(request: web.Request) -> web.Response:
    """Re-read the configuration (file, environment, flags) and apply it as SIGHUP does: 200
    with what was applied and what waits for a restart, 422 when the new configuration is
    refused (the old one keeps serving), 409 when the gateway has no configuration source."""
    st = request.app[STATE]
    check_admin(request, st.config.server)  # no body: what to load is the configuration's source
    if st.reloader is None:
        raise ApiError(
            409, "this gateway was started without a configuration source to reload", code="not_reloadable"
        )
    outcome = await st.reloader.reload("POST /admin/reload")
    return web.Response(
        status=200 if outcome.ok else 422,
        body=json.dumps(outcome.as_dict()).encode(),
        content_type="application/json",
    )
