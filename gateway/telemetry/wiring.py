"""Adapters that connect telemetry to the gateway's runtimes and engine scrapers.

Duck-typed on purpose: telemetry reads the runtime objects, it does not import them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from gateway.routing.types import ModelView
from gateway.telemetry.state import ModelState, StateSource

log = logging.getLogger("specgate.telemetry")


class _PolicyLike(Protocol):
    def snapshot(self) -> dict[str, object]: ...


class ModelRuntimeLike(Protocol):
    """What the state source reads of a model runtime (``gateway.engines.runtime.ModelRuntime``)."""

    @property
    def name(self) -> str: ...

    @property
    def policy(self) -> _PolicyLike: ...

    def view(self, now: float) -> ModelView: ...


class ScrapeStateLike(Protocol):
    @property
    def last_error(self) -> str | None: ...

    @property
    def last_duration_s(self) -> float | None: ...


def runtime_state_source(
    runtimes: Callable[[], Iterable[ModelRuntimeLike]], clock: Callable[[], float] = time.monotonic
) -> StateSource:
    """A state source reading each model runtime's view and policy snapshot at scrape time."""

    def source() -> Iterator[ModelState]:
        now = clock()
        for rt in runtimes():
            try:
                snap = dict(rt.policy.snapshot())
            except Exception:
                log.exception("policy snapshot failed for a model")
                snap = {}
            snap.setdefault("policy", getattr(rt.policy, "name", type(rt.policy).__name__))
            yield ModelState(model=rt.name, view=rt.view(now), policy=snap)

    return source


def scrape_error_kind(error: str | None) -> str:
    """A bounded token for a scraper error string (``timeout``, ``connect``, ``http_5xx``, ...)."""
    if error is None:
        return "ok"
    e = error.strip().lower()
    if e.startswith("timeout"):
        return "timeout"
    if e.startswith("connect"):
        return "connect"
    if e.startswith("http"):
        code = e.removeprefix("http").strip()[:1]
        return f"http_{code}xx" if code.isdigit() else "http"
    if e.startswith("parse"):
        return "parse"
    if "no vllm" in e:
        return "no_vllm_metrics"
    if "too large" in e:
        return "too_large"
    return "error"


class _Recorder(Protocol):
    def record_scrape(
        self, engine: str, ok: bool, duration_s: float | None = None, error: str | None = None
    ) -> None: ...


def scrape_listener(telemetry: _Recorder, engine: str) -> Callable[[ScrapeStateLike], None]:
    """An ``on_update`` callback for ``MetricsScraper`` that counts each scrape's result."""

    def on_update(state: ScrapeStateLike) -> None:
        err = state.last_error
        if err is None:
            telemetry.record_scrape(engine, True, state.last_duration_s, None)
        else:
            telemetry.record_scrape(engine, False, None, scrape_error_kind(err))

    return on_update


def with_scrape_telemetry(
    sink: Callable[[ScrapeStateLike], None], telemetry: object, engine: str
) -> Callable[[ScrapeStateLike], None]:
    """``sink`` plus, when ``telemetry`` records scrapes, a count of each scrape's result."""
    if not callable(getattr(telemetry, "record_scrape", None)):
        return sink
    count = scrape_listener(telemetry, engine)  # type: ignore[arg-type]

    def both(state: ScrapeStateLike) -> None:
        sink(state)
        try:
            count(state)
        except Exception:
            log.exception("scrape telemetry failed")

    return both


def attach_models(telemetry: object, models: Mapping[str, ModelRuntimeLike]) -> None:
    """Point ``telemetry``'s routing-state collector at the gateway's model runtimes (if it has one)."""
    setter = getattr(telemetry, "set_state_source", None)
    if callable(setter):
        setter(runtime_state_source(lambda: list(models.values())))
    prime = getattr(telemetry, "prime_engines", None)
    if callable(prime):
        now = time.monotonic()
        prime([e.name for m in models.values() for p in m.view(now).pairs for e in p.engines])


def forget_engines(telemetry: object, engines: Iterable[str]) -> None:
    """Tell ``telemetry`` (if it keeps per-engine series) that these engines left the fleet."""
    forget = getattr(telemetry, "forget_engines", None)
    if callable(forget):
        forget(list(engines))
