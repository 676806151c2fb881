from __future__ import annotations

import pytest

from gateway.routing.rules import NoEngineAvailable
from gateway.routing.static import FixedPolicy, TemperaturePolicy
from gateway.routing.types import (
    EngineStats,
    EngineView,
    ModelView,
    PairView,
    RequestFeatures,
    Route,
    RouteOverride,
)


def view(spec_ok: bool = True, base_ok: bool = True, pinned: RouteOverride = RouteOverride.AUTO) -> ModelView:
    pair = PairView(
        spec=EngineView(name="s", route=Route.SPEC, healthy=spec_ok, method="ngram", k=5),
        base=EngineView(name="b", route=Route.BASE, healthy=base_ok),
    )
    return ModelView(model="m", pairs=(pair,), pinned=pinned)


@pytest.mark.parametrize(
    ("features", "v", "route", "reason", "fallback"),
    [
        (RequestFeatures(model="m", temperature=0.0), view(), Route.SPEC, "low_temperature", "b"),
        (RequestFeatures(model="m", temperature=1.0), view(), Route.BASE, "high_temperature", "s"),
        (
            RequestFeatures(model="m", temperature=0.0, refused_params=("min_p",)),
            view(),
            Route.BASE,
            "refused_params",
            None,
        ),
        (RequestFeatures(model="m", temperature=0.0), view(spec_ok=False), Route.BASE, "spec_down", None),
        (RequestFeatures(model="m", temperature=1.0), view(base_ok=False), Route.SPEC, "base_down", None),
        (RequestFeatures(model="m", temperature=1.0, forced=Route.SPEC), view(), Route.SPEC, "forced", "b"),
        (
            RequestFeatures(model="m", temperature=0.0),
            view(pinned=RouteOverride.BASE),
            Route.BASE,
            "pinned",
            "s",
        ),
    ],
)
def test_temperature_policy_with_hard_rules(
    features: RequestFeatures, v: ModelView, route: Route, reason: str, fallback: str | None
) -> None:
    d = TemperaturePolicy(max_temperature=0.3).decide(features, v, 0.0)
    assert (d.route, d.reason, d.fallback) == (route, reason, fallback)


def test_refused_params_with_base_down_raises() -> None:
    with pytest.raises(NoEngineAvailable):
        FixedPolicy(Route.SPEC).decide(
            RequestFeatures(model="m", refused_params=("logit_bias",)), view(base_ok=False), 0.0
        )


def test_least_loaded_pair_is_chosen() -> None:
    busy = PairView(EngineView("s1", Route.SPEC, inflight=9), EngineView("b1", Route.BASE, inflight=3))
    idle = PairView(
        EngineView("s2", Route.SPEC), EngineView("b2", Route.BASE, stats=EngineStats(running=1.0))
    )
    d = FixedPolicy(Route.SPEC).decide(RequestFeatures(model="m"), ModelView("m", (busy, idle)), 0.0)
    assert d.engine == "s2"
