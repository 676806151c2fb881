from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from gateway.routing.types import EngineView, ModelView, PairView, Route
from gateway.telemetry import build_telemetry, runtime_state_source, scrape_listener
from gateway.telemetry.wiring import scrape_error_kind


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (None, "ok"),
        ("timeout", "timeout"),
        ("connect: ClientConnectorError", "connect"),
        ("http 503", "http_5xx"),
        ("parse: line 3: bad value", "parse"),
        ("no vllm metrics on the page", "no_vllm_metrics"),
        ("page too large", "too_large"),
        ("something new", "error"),
    ],
)
def test_scrape_error_kinds_are_bounded(error: str | None, kind: str) -> None:
    assert scrape_error_kind(error) == kind


@dataclass
class _State:
    last_error: str | None
    last_duration_s: float | None = None


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, float | None, str | None]] = []

    def record_scrape(
        self, engine: str, ok: bool, duration_s: float | None = None, error: str | None = None
    ) -> None:
        self.calls.append((engine, ok, duration_s, error))


def test_scrape_listener() -> None:
    rec = _Recorder()
    cb = scrape_listener(rec, "spec0")
    cb(_State(None, 0.012))
    cb(_State("http 502", 0.5))
    assert rec.calls == [("spec0", True, 0.012, None), ("spec0", False, None, "http_5xx")]


class _Policy:
    name = "adaptive"

    def snapshot(self) -> dict[str, object]:
        return {"mode": "speculate"}


class _Runtime:
    name = "m1"
    policy = _Policy()

    def __init__(self) -> None:
        self.seen_now: list[float] = []

    def view(self, now: float) -> ModelView:
        self.seen_now.append(now)
        pair = PairView(
            spec=EngineView(name="s", route=Route.SPEC), base=EngineView(name="b", route=Route.BASE)
        )
        return ModelView(model="m1", pairs=(pair,))


def test_runtime_state_source() -> None:
    rt = _Runtime()
    states = list(runtime_state_source(lambda: [rt], clock=lambda: 42.0)())
    assert rt.seen_now == [42.0]
    assert states[0].model == "m1"
    assert states[0].policy == {"mode": "speculate", "policy": "adaptive"}


def test_build_telemetry_from_mapping() -> None:
    tel = build_telemetry({"tracing": "off", "log_format": "json"}, known_models=["a", "b"])
    assert tel.config.known_models == ("a", "b")
    assert tel.config.log_format == "json"
    with pytest.raises(ValidationError):
        build_telemetry({"tracing": "off", "no_such_key": 1})
