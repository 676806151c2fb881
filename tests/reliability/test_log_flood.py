"""A failing engine under load does not flood the log."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from gateway.proxy import forward
from gateway.telemetry.logthrottle import LogThrottle
from tests.fakes import FakeClock
from tests.reliability.rig import COPY_PROMPT, SPEC, chat, post, rig


def test_throttle_logs_first_then_counts_then_reports_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(0.0)
    th = LogThrottle(5.0, clock=clock)
    log = logging.getLogger("test.throttle")
    caplog.set_level(logging.WARNING, logger="test.throttle")
    assert th.log(log, logging.WARNING, "a", "engine %s failed", "e1")
    for _ in range(50):
        clock.t += 0.05
        assert not th.log(log, logging.WARNING, "a", "engine %s failed", "e1")
    assert th.log(log, logging.WARNING, "b", "engine %s failed", "e2")  # another key is independent
    clock.t = 5.0
    assert th.log(log, logging.WARNING, "a", "engine %s failed", "e1")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        "engine e1 failed",
        "engine e2 failed",
        "engine e1 failed (50 similar suppressed in the last 5s)",
    ]


def test_throttle_memory_and_lines_are_bounded() -> None:
    clock = FakeClock(0.0)
    th = LogThrottle(5.0, clock=clock, max_keys=8)
    log = logging.getLogger("test.throttle.bounded")
    written = sum(th.log(log, logging.WARNING, f"k{i}", "x") for i in range(1000))
    assert len(th._last) <= 8
    assert written == 8  # 7 keys of their own, then one shared overflow key
    clock.t = 5.0  # once their interval is over, quiet keys make room again
    assert th.log(log, logging.WARNING, "new", "x")
    assert len(th._last) <= 8


async def test_failovers_of_a_failing_engine_log_one_warning_not_one_per_request(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward, "_THROTTLE", LogThrottle(60.0))
    caplog.set_level(logging.INFO, logger="gateway")
    # Outlier detection off, so that every request tries the failing engine first.
    retry = {
        "failures_to_unhealthy": 1000,
        "failure_rate_to_unhealthy": 1.0,
        "failure_rate_min_attempts": 100_000,
    }
    async with rig(retry=retry) as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, error_rate=1.0)
        for _ in range(30):
            reply = await post(
                s, r.url("/v1/chat/completions"), chat(COPY_PROMPT, temperature=0.0, max_tokens=3)
            )
            assert reply.status == 200 and reply.headers["x-specgate-reason"] == "failover"
    lines = [rec.getMessage() for rec in caplog.records if rec.name.startswith("gateway")]
    assert len([m for m in lines if "failed before the first byte" in m]) == 1, lines
