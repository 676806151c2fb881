"""The one stats record: made by the parser's window, carried as is to the policy and the admin state."""

from __future__ import annotations

from dataclasses import fields

from gateway.engines.parse import MetricsSample, MetricsWindow
from gateway.engines.stats import ScrapeState
from gateway.routing.types import UNKNOWN_STATS, EngineStats

# What GET /admin/state has always shown of an engine's scrape.
ADMIN_KEYS = {
    "scraped_at",
    "ok",
    "error",
    "running",
    "waiting",
    "kv_usage",
    "acceptance_rate",
    "mean_acceptance_length",
    "per_position",
    "tpot_s",
    "step_s",
    "tokens_per_step",
}


def _sample(drafts: float, accepted: float, per_pos: tuple[float, ...]) -> MetricsSample:
    return MetricsSample(
        drafts=drafts,
        draft_tokens=4 * drafts,
        accepted=accepted,
        per_position=per_pos,
        running=3.0,
        waiting=0.0,
        generation_tokens=drafts + accepted,
    )


def _record() -> EngineStats:
    w = MetricsWindow(window_s=10.0)
    w.add(0.0, _sample(100.0, 200.0, (80.0, 60.0, 40.0, 20.0)))
    return w.add(1.0, _sample(200.0, 400.0, (160.0, 120.0, 80.0, 40.0)))


def test_every_field_of_the_record_is_serialised_once_by_name() -> None:
    st = _record()
    assert isinstance(st, EngineStats)
    d = st.as_dict()
    assert list(d) == [f.name for f in fields(EngineStats)]
    assert d["per_position"] == list(st.per_position or ()) and isinstance(d["per_position"], list)
    assert d["per_position"] == [0.8, 0.6, 0.4, 0.2]
    assert d["acceptance_rate"] == 0.5 and d["running"] == 3.0 and d["at"] == 1.0 and d["window_s"] == 1.0


def test_admin_state_of_a_scrape_is_its_status_then_the_record() -> None:
    st = _record()
    d = ScrapeState(stats=st, stale=False, last_success=1.0, last_error="timeout").as_dict()
    assert set(d) >= ADMIN_KEYS
    assert d == {"scraped_at": 1.0, "ok": True, "error": "timeout", **st.as_dict()}


def test_a_scrape_without_a_record_shows_every_signal_unknown() -> None:
    s = ScrapeState(last_error="no vllm metrics on the page", consecutive_failures=1)
    assert not s.ok and s.scraped_at == 0.0
    d = s.as_dict()
    assert set(d) >= ADMIN_KEYS and d["ok"] is False and d["error"] == "no vllm metrics on the page"
    assert all(d[k] is None for k in ADMIN_KEYS - {"scraped_at", "ok", "error"})
    assert ScrapeState(stats=UNKNOWN_STATS).ok is False  # never scraped successfully
