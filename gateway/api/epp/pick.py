"""The request phase of the Endpoint Picker: the proxy's decision path, without the relay.

:func:`admit` runs what :class:`gateway.api.completions.Exchange` runs before it forwards
(admission, keys, the model, validation and features, the policy with its hard rules)
and turns the decision into what Envoy needs: the endpoints (``ip:port`` of the engine
chosen, then its sibling where the request may move), the request headers to set, and
the body when the engine serves the model under another name. Anything it refuses is an
:class:`~gateway.wire.errors.ApiError`, which Envoy answers itself (an immediate
response). The request holds its in-flight slots from here until :meth:`Picked.release`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict

from gateway.api.auth import may_override_route
from gateway.api.completions import admit_model, authenticate, choose_route, overloaded, tell_decided
from gateway.api.epp.endpoints import EndpointBook
from gateway.api.features import CHAT, COMPLETIONS, ParsedRequest, model_name, parse_request
from gateway.api.state import GatewayState
from gateway.engines.runtime import EngineRuntime, ModelRuntime
from gateway.proxy.body import splice_model
from gateway.routing.types import Decision, EngineView, ModelView, PairView
from gateway.telemetry.hooks import RequestTelemetry
from gateway.wire.errors import ApiError
from gateway.wire.headers import ROUTE

_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}


def endpoint_of(path: str) -> str | None:
    """CHAT or COMPLETIONS for the inference paths; None for any other path."""
    found = _PATHS.get(path)  # the path as clients send it: no query, no trailing slash
    return found if found is not None else _PATHS.get(path.split("?", 1)[0].rstrip("/"))


@dataclass(slots=True)
class ClientRequest:
    """What the EPP knows of the client's request: its headers (``.headers`` is what the
    key checks read), and the endpoints Envoy allows (the subset hint; None: any)."""

    headers: CIMultiDict[str]
    rid: str
    subset: frozenset[str] | None = None


@dataclass(slots=True)
class Picked:
    """A routed request: what it holds until :meth:`release`."""

    st: GatewayState
    model: ModelRuntime
    parsed: ParsedRequest
    decision: Decision
    engine: EngineRuntime
    endpoints: str
    set_headers: dict[str, str]
    body: bytes | None  # the body for the engine, where it differs from the client's
    tel: RequestTelemetry
    started: float
    rid: str
    released: bool = False

    @property
    def chosen(self) -> EngineRuntime:
        """The engine the decision named (``engine`` is where Envoy served it)."""
        return self.model.engines[self.decision.engine]

    def move_to(self, engine: EngineRuntime) -> None:
        """Envoy served it on ``engine`` (it went down the endpoint list): count it there."""
        if engine is self.engine or self.released:
            return
        self._leave(self.engine)
        self.engine = engine
        engine.inflight += 1
        self._changed(engine)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._leave(self.engine)
        self.model.inflight -= 1
        self.st.request_done()

    def _leave(self, engine: EngineRuntime) -> None:
        engine.inflight -= 1
        self._changed(engine)

    @staticmethod
    def _changed(engine: EngineRuntime) -> None:
        if engine.on_inflight is not None:
            engine.on_inflight()


def admit(
    st: GatewayState, book: EndpointBook, req: ClientRequest, endpoint: str, body: dict[str, Any], raw: bytes
) -> Picked:
    """Admission → keys → model → features → decision → endpoints. Raises ApiError."""
    refusal = overloaded(st)
    if refusal is not None:
        raise refusal.error
    authenticate(st, req)
    name = model_name(body)
    mrt = admit_model(st, req, name)
    parsed = parse_request(
        body, endpoint, req.headers.get(ROUTE), allow_override=may_override_route(req, mrt.config.routing)
    )
    tel = st.telemetry.start_request(name, endpoint, req.rid, req.headers)
    t0 = time.perf_counter()
    decision = decide(mrt, book, parsed, req.subset)
    decision_s = time.perf_counter() - t0
    engine = mrt.engines[decision.engine]
    addr = book.address(engine.name)
    if addr is None:
        raise ApiError(
            503,
            f"engine {engine.name} has no known address yet; retry shortly",
            code="no_engine_available",
            headers={"Retry-After": "1"},
        )
    endpoints = addr
    sibling = _sibling(mrt, book, decision, engine, req.subset)
    if sibling is not None:
        endpoints = f"{addr},{sibling}"
    if mrt.on_decided:
        tell_decided(mrt, parsed.features, decision)
    try:
        tel.decided(parsed.features, decision, decision_s)
    except Exception:  # telemetry never fails a request
        pass
    set_headers = {"x-request-id": req.rid, **dict(tel.upstream_started(engine.name, 1))}
    auth = engine.config.auth_headers()
    if auth:
        set_headers["authorization"] = auth["Authorization"]
    served = engine.config.served_model_name
    new_body = None
    if served != name:
        new_body = splice_model(raw, name, served, add_usage=False)
        if new_body is None:
            new_body = json.dumps(
                {**body, "model": served}, ensure_ascii=False, separators=(",", ":")
            ).encode()
    # Held until release(): the gateway's, the model's and the engine's in-flight counts.
    st.inflight += 1
    mrt.inflight += 1
    engine.inflight += 1
    engine.total_requests += 1
    Picked._changed(engine)
    return Picked(
        st, mrt, parsed, decision, engine, endpoints, set_headers, new_body, tel, time.monotonic(), req.rid
    )


def _restricted(view: EngineView, allowed: frozenset[str], book: EndpointBook) -> EngineView:
    if book.address(view.name) in allowed:
        return view
    return dataclasses.replace(view, healthy=False)


def model_view(mrt: ModelRuntime, book: EndpointBook, subset: frozenset[str] | None, now: float) -> ModelView:
    """The model as the policy sees it; engines outside Envoy's subset hint, or whose
    address is not known, count as down."""
    view = mrt.view(now)
    if subset is None and book.complete:
        return view
    allowed = subset if subset is not None else frozenset(a for e in mrt.engines if (a := book.address(e)))
    return dataclasses.replace(
        view,
        pairs=tuple(
            PairView(
                spec=None if p.spec is None else _restricted(p.spec, allowed, book),
                base=_restricted(p.base, allowed, book),
                device=p.device,
            )
            for p in view.pairs
        ),
    )


def decide(
    mrt: ModelRuntime, book: EndpointBook, parsed: ParsedRequest, subset: frozenset[str] | None
) -> Decision:
    """The proxy's :func:`~gateway.api.completions.choose_route` on the view Envoy allows."""
    view = model_view(mrt, book, subset, time.monotonic())
    where = " among the endpoints Envoy allowed" if subset is not None else ""
    return choose_route(mrt, mrt.name, parsed.features, view, where=where)


def _sibling(
    mrt: ModelRuntime,
    book: EndpointBook,
    decision: Decision,
    engine: EngineRuntime,
    subset: frozenset[str] | None,
) -> str | None:
    """The address Envoy may fall back to: the decision's fallback engine when it is
    healthy, allowed, and takes the same request (model name and key)."""
    if decision.fallback is None:
        return None
    other = mrt.engines.get(decision.fallback)
    if other is None or not other.healthy() or other.draining:
        return None
    if other.config.served_model_name != engine.config.served_model_name:
        return None
    if other.config.auth_headers() != engine.config.auth_headers():
        return None
    addr = book.address(other.name)
    if addr is None or (subset is not None and addr not in subset):
        return None
    return addr


def passthrough(st: GatewayState, book: EndpointBook, subset: frozenset[str] | None) -> tuple[str, str]:
    """A request that is not an inference (GET /v1/models, /tokenize, ...): the first
    healthy plain engine Envoy allows. (engine name, address); ApiError 503 when none."""
    now = time.monotonic()
    for mrt in st.models.values():
        for pair in mrt.active_pairs:  # never a pair that is leaving
            for e in (pair.base, *(() if pair.spec is None else (pair.spec,))):
                addr = book.address(e.name)
                if addr and e.healthy(now) and (subset is None or addr in subset):
                    return e.name, addr
    raise ApiError(
        503, "no engine is available right now", code="no_engine_available", headers={"Retry-After": "1"}
    )


def subset_of(metadata: Mapping[str, Mapping[str, Any]]) -> frozenset[str] | None:
    """Envoy's subset hint (``envoy.lb.subset_hint`` / ``x-gateway-destination-endpoint-subset``)."""
    ns = metadata.get("envoy.lb.subset_hint")
    if not ns or "x-gateway-destination-endpoint-subset" not in ns:
        return None
    value = ns["x-gateway-destination-endpoint-subset"]
    items = value if isinstance(value, list) else str(value).split(",")
    return frozenset(str(v).strip() for v in items if str(v).strip())
