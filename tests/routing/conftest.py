from __future__ import annotations

from dataclasses import fields, replace

from gateway.routing.types import EngineStats, EngineView, ModelView, PairView, RequestFeatures, Route

_STATS = frozenset(f.name for f in fields(EngineStats))


def _split(kw: dict[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """(EngineView fields, EngineStats fields): tests set the scraped signals by name."""
    return {k: v for k, v in kw.items() if k not in _STATS}, {k: v for k, v in kw.items() if k in _STATS}


def engine(route: Route, **kw: object) -> EngineView:
    base: dict[str, object] = {"name": route.value, "route": route, "stale": False}
    if route is Route.SPEC:
        base.update(method="ngram", k=5)
    own, stats = _split(kw)
    base.update(own)
    return EngineView(**base, stats=EngineStats(**stats))  # type: ignore[arg-type]


def view(spec: EngineView | None = None, base: EngineView | None = None) -> ModelView:
    return ModelView("m", (PairView(spec or engine(Route.SPEC), base or engine(Route.BASE)),))


def with_(e: EngineView, **kw: object) -> EngineView:
    own, stats = _split(kw)
    return replace(e, **own, stats=replace(e.stats, **stats))  # type: ignore[arg-type]


EDIT = RequestFeatures("m", temperature=0.0, overlap=0.85, kind="edit", max_tokens=256)
CHAT_HOT = RequestFeatures("m", temperature=1.0, overlap=0.03, kind="chat")
SUMMARY = RequestFeatures("m", temperature=0.3, overlap=0.3, kind="summary")
