"""Passive outlier detection: engines failing in a row, or often, are taken out for a cooldown."""

from __future__ import annotations

import aiohttp

from gateway.config.models import EngineConfig
from gateway.engines.runtime import EngineRuntime
from gateway.routing.types import Route
from tests.fakes import FakeClock
from tests.reliability.rig import COPY_PROMPT, SPEC, chat, post, rig


def _engine(clock: FakeClock, **kw: float) -> EngineRuntime:
    cfg = EngineConfig(name="e", url="http://127.0.0.1:1", served_model_name="m")
    args = {
        "failures_to_unhealthy": 3,
        "cooldown_s": 5.0,
        "failure_rate": 0.5,
        "failure_window_s": 10.0,
        **kw,
    }
    return EngineRuntime(
        cfg,
        Route.SPEC,
        failures_to_unhealthy=int(args["failures_to_unhealthy"]),
        cooldown_s=args["cooldown_s"],
        failure_rate=args["failure_rate"],
        failure_window_s=args["failure_window_s"],
        failure_min_attempts=10,
        clock=clock,
    )


def test_half_failing_never_in_a_row_is_taken_out_by_rate() -> None:
    clock = FakeClock()
    e = _engine(clock)
    for i in range(9):  # S F S F ...: never 3 in a row; below the minimum attempts
        clock.t += 0.1
        e.record_failure("status_500") if i % 2 == 1 else e.record_success()
        assert e.healthy()
    clock.t += 0.1
    e.record_failure("status_500")  # 10 attempts, 5 failed: 50 %
    assert not e.healthy()
    clock.t += 5.0
    assert e.healthy()  # back after the cooldown, judged afresh
    e.record_failure("status_500")
    assert e.healthy()


def test_rare_failures_and_old_failures_do_not_count() -> None:
    clock = FakeClock()
    e = _engine(clock)
    for i in range(100):  # 1 in 4 fails: below the rate
        clock.t += 0.1
        e.record_failure("x") if i % 4 == 0 else e.record_success()
        assert e.healthy()
    for _ in range(4):  # 4 failures, each alone in its 10 s window
        clock.t += 11.0
        e.record_failure("x")
        e.record_success()
        assert e.healthy()


def test_consecutive_failures_still_take_it_out_at_once() -> None:
    clock = FakeClock()
    e = _engine(clock)
    for _ in range(3):
        e.record_failure("connect")
    assert not e.healthy()


async def test_an_engine_failing_most_requests_but_not_in_a_row_stops_getting_traffic() -> None:
    # /health is fine and failures alternate: only the failure rate can see it.
    async with (
        rig(retry={"failures_to_unhealthy": 1000, "cooldown_s": 60.0}) as r,
        aiohttp.ClientSession() as s,
    ):
        r.faults(SPEC, error_rate=0.65)
        body = chat(COPY_PROMPT, temperature=0.0, max_tokens=5)
        sent = 0
        while r.engine("spec0").healthy() and sent < 60:
            reply = await post(s, r.url("/v1/chat/completions"), body)
            assert reply.status == 200  # every failure was hidden by a retry on the sibling
            sent += 1
        assert not r.engine("spec0").healthy() and r.engine("spec0").active_healthy
        seen = r.emulated(SPEC).handle.requests_seen
        for _ in range(5):
            reply = await post(s, r.url("/v1/chat/completions"), body)
            assert reply.status == 200 and reply.headers["x-specgate-route"] == "base"
        assert r.emulated(SPEC).handle.requests_seen == seen
