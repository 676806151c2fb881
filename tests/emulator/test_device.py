"""The shared device timeline reproduces the measured H200 time-slicing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import pytest

from gateway.physics import get_profile, shared_gpu_scenarios
from specgate_lab.emulator.device import Device, VirtualClock
from specgate_lab.emulator.engine import Engine, EngineConfig, StepPlan, TokenEvent
from tests.emulator.conftest import run_all


@dataclass(eq=False)
class FixedStepper:
    """Stands in for an engine that keeps ``batch`` sequences of ``q`` tokens stepping."""

    duration_s: float
    steps_left: int
    completions: list[float]

    def has_work(self) -> bool:
        return self.steps_left > 0

    def plan_step(self, now: float) -> StepPlan:
        return StepPlan(1, 1.0, 1024, 0, 1, 0.0, self.duration_s)

    def commit_step(self, now: float) -> list[TokenEvent]:
        self.steps_left -= 1
        self.completions.append(now)
        return []


def _mean_step_ms(times: list[float]) -> float:
    # skip the first steps (start-up phase), use the steady state
    tail = times[10:]
    return 1e3 * (tail[-1] - tail[0]) / (len(tail) - 1)


@pytest.mark.parametrize("scenario", shared_gpu_scenarios(), ids=lambda s: s.name)
def test_shared_gpu_scenarios_within_15_percent(scenario) -> None:  # type: ignore[no-untyped-def]
    prof = get_profile("h200-qwen3-8b")
    dev = Device()
    workers = []
    for w in scenario.workers:
        s = FixedStepper(prof.step_ms(w.batch, w.q) / 1e3, 400, [])
        dev.attach(cast(Engine, s))
        workers.append((w, s))
    dev.run_until(0.0)
    # measure while all workers are still busy: stop at the first worker to finish
    horizon = min(s.duration_s * 200 * len(workers) for _, s in workers)
    dev.run_until(horizon)
    for w, s in workers:
        assert len(s.completions) > 30
        assert _mean_step_ms(s.completions) == pytest.approx(w.ms_p50, rel=0.15), (scenario.name, w.tag)


def test_two_real_engines_on_one_device_each_slow_down_about_2x() -> None:
    solo_dev = Device()
    solo = solo_dev.attach(Engine(EngineConfig("solo")))
    r = solo.make_request("Why is the sky blue?", max_tokens=200, ignore_eos=True)
    solo_dev.submit(solo, r, 0.0)
    run_all(solo_dev)
    assert r.finished_at is not None and r.first_token_at is not None
    solo_tpot = (r.finished_at - r.first_token_at) / 199

    dev = Device()
    a = dev.attach(Engine(EngineConfig("a")))
    b = dev.attach(Engine(EngineConfig("b")))
    ra = a.make_request("Why is the sky blue?", max_tokens=200, ignore_eos=True)
    rb = b.make_request("Why is the grass green?", max_tokens=200, ignore_eos=True)
    dev.submit(a, ra, 0.0)
    dev.submit(b, rb, 0.0)
    run_all(dev)
    for req in (ra, rb):
        assert req.finished_at is not None and req.first_token_at is not None
        tpot = (req.finished_at - req.first_token_at) / 199
        assert tpot / solo_tpot == pytest.approx(11.8 / 5.52, rel=0.15)


def test_device_is_idle_without_work_and_clock_helpers() -> None:
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("x")))
    assert dev.next_event_time() is None
    assert dev.run_until(5.0) == []
    assert dev.t == 5.0
    req = eng.make_request("hello there", max_tokens=3, ignore_eos=True)
    dev.submit(eng, req, 5.0)
    t = dev.next_event_time()
    assert t is not None and t > 5.0
    clock = VirtualClock()
    clock.advance_to(3.0)
    clock.advance_to(1.0)
    assert clock.now() == 3.0
