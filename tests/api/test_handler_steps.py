"""The completions handler's steps, one at a time (the end-to-end tests cover them together)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from gateway.api.app import build_app
from gateway.api.completions import Exchange, choose_route, overloaded
from gateway.api.state import STATE, GatewayState
from gateway.routing.rules import NoEngineAvailable
from gateway.routing.types import Decision, ModelView, Outcome, Reason, RequestFeatures, Route
from gateway.wire.errors import ApiError
from gateway.wire.headers import REQUEST_ID
from tests.proxy.harness import gateway_config


@dataclass
class _Finished:
    calls: list[tuple[str, int, str | None]] = field(default_factory=list)

    def start_request(self, model: str, endpoint: str, request_id: str, headers: Mapping[str, str]) -> Any:
        outer = self

        class _Req:
            def finished(self, status: int, **kw: Any) -> None:
                outer.calls.append((model, status, kw.get("error")))

            def __getattr__(self, name: str) -> Any:
                return lambda *a, **k: {}

        return _Req()


def _app(**over: Any) -> tuple[web.Application, _Finished]:
    tel = _Finished()
    app = build_app(gateway_config("http://127.0.0.1:9", "http://127.0.0.1:9", **over), telemetry=tel)
    return app, tel


def _exchange(app: web.Application, rid: str = "rid-1") -> Exchange:
    request = make_mocked_request("POST", "/v1/chat/completions", headers={REQUEST_ID: rid}, app=app)
    return Exchange.begin(request, "chat")


def test_admission_refuses_while_draining_and_at_the_limit() -> None:
    app, tel = _app(server={"max_concurrency": 2})
    st = app[STATE]
    assert overloaded(st) is None
    st.inflight = 2
    refusal = overloaded(st)
    assert refusal is not None and refusal.label == "concurrency_limit"
    assert (refusal.error.status, refusal.error.code) == (429, "too_many_requests")
    st.draining = True
    refusal = overloaded(st)
    assert refusal is not None and refusal.label == "shutting_down"
    assert refusal.error.headers == {"Retry-After": "1", "Connection": "close"}
    resp = _exchange(app).refuse(refusal)
    assert resp.status == 503 and resp.headers[REQUEST_ID] == "rid-1"
    assert tel.calls == [("unknown", 503, "shutting_down")]  # reported at once, no slot taken
    assert st.inflight == 2


def test_admit_model_holds_a_slot_until_close() -> None:
    app, tel = _app(model={"max_concurrency": 1})
    st = app[STATE]
    ex = _exchange(app)
    st.inflight += 1  # as the handler does once admitted
    mrt = ex.admit_model("m1")
    assert (mrt.inflight, ex.model, ex.counted) == (1, "m1", mrt)
    other = _exchange(app, "rid-2")
    with pytest.raises(ApiError) as e:
        other.admit_model("m1")
    assert (e.value.status, e.value.code, e.value.headers) == (429, "too_many_requests", {"Retry-After": "1"})
    assert other.counted is None and other.model == "unknown"
    ex.status = 200
    ex.close()
    assert (mrt.inflight, st.inflight) == (0, 0)
    assert tel.calls == [("m1", 200, None)]


def test_an_unknown_model_is_a_404_naming_the_known_ones() -> None:
    app, _ = _app()
    with pytest.raises(ApiError) as e:
        _exchange(app).admit_model("nope")
    assert (e.value.status, e.value.code, e.value.param) == (404, "model_not_found", "model")
    assert "Known models: m1" in e.value.message


def test_failed_reports_the_error_code_with_the_route_headers_so_far() -> None:
    app, _ = _app()
    ex = _exchange(app)
    ex.headers["x-specgate-route"] = "base"
    resp = ex.failed(ApiError(400, "bad", code="invalid_value"))
    assert (resp.status, ex.status, ex.error) == (400, 400, "invalid_value")
    assert resp.headers["x-specgate-route"] == "base" and resp.headers[REQUEST_ID] == "rid-1"


class _Raising:
    name = "raising"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        raise self.exc

    def observe(self, outcome: Outcome, now: float) -> None:
        pass

    def snapshot(self) -> dict[str, object]:
        return {}


def _state(policy: _Raising) -> GatewayState:
    app = build_app(gateway_config("http://127.0.0.1:9", "http://127.0.0.1:9"), policies={"m1": policy})
    return app[STATE]


def test_choose_route_survives_a_failing_policy() -> None:
    st = _state(_Raising(RuntimeError("bug")))
    d = choose_route(st.models["m1"], "m1", RequestFeatures(model="m1"))
    assert (d.route, d.engine, d.reason) == (Route.BASE, "base0", Reason.POLICY_ERROR)


def test_choose_route_with_no_engine_is_a_503() -> None:
    st = _state(_Raising(NoEngineAvailable("m1", "both down")))
    with pytest.raises(ApiError) as e:
        choose_route(st.models["m1"], "m1", RequestFeatures(model="m1"))
    assert (e.value.status, e.value.code) == (503, "no_engine_available")
    assert "(both down)" in e.value.message
