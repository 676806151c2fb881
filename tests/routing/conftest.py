from __future__ import annotations

from dataclasses import replace

from gateway.routing.types import EngineView, ModelView, PairView, RequestFeatures, Route


def engine(route: Route, **kw: object) -> EngineView:
    base: dict[str, object] = {"name": route.value, "route": route, "stale": False}
    if route is Route.SPEC:
        base.update(method="ngram", k=5)
    base.update(kw)
    return EngineView(**base)  # type: ignore[arg-type]


def view(spec: EngineView | None = None, base: EngineView | None = None) -> ModelView:
    return ModelView("m", (PairView(spec or engine(Route.SPEC), base or engine(Route.BASE)),))


def with_(e: EngineView, **kw: object) -> EngineView:
    return replace(e, **kw)  # type: ignore[arg-type]


EDIT = RequestFeatures("m", temperature=0.0, overlap=0.85, kind="edit", max_tokens=256)
CHAT_HOT = RequestFeatures("m", temperature=1.0, overlap=0.03, kind="chat")
SUMMARY = RequestFeatures("m", temperature=0.3, overlap=0.3, kind="summary")
