"""Non-stationary traffic: a scenario is a list of phases (load, mix and temperature over time).

A :class:`Phase` lasts ``duration_s`` seconds; its arrival rate is constant or ramps
linearly from ``start_qps`` to ``end_qps``; its requests come from the workload corpus with
a kind ``mix`` (``None``: the corpus default) and a temperature spec. Load shapes use the
shared schedule grammar of :mod:`specgate_lab.workload.schedule` (``ramp:0.5-32:300,32:60``), so a
``--schedule`` on the command line and a named scenario are one mechanism.

A scenario may also name the engine pair it runs on (:class:`Pair`: the speculative method,
its config, the batch cap, and the engines' truth against the profile the router assumes,
which may change with the batch); a field it leaves unset keeps the command line's, and a
flag given on the command line overrides the scenario's.

Arrivals are a Poisson process of time-varying rate, drawn by thinning: candidates at the
phase's peak rate, each kept with probability rate(t) / peak. Requests come from one
deterministic stream per (mix, temperature) pair, so two phases with the same mix and a
constant temperature see the same prompts, and every policy of a run sees identical
arrivals and requests.
"""

from __future__ import annotations

import json
import math
import random
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

from specgate_lab.workload import WorkloadRequest, iter_requests
from specgate_lab.workload.schedule import Schedule, parse_schedule


@dataclass(frozen=True, slots=True)
class Phase:
    duration_s: float
    start_qps: float
    end_qps: float
    mix: str | None = None  # workload kind mix, e.g. "edit=1" (None: the run's default)
    temperature: str | None = None  # temperature spec, e.g. "0" (None: the run's default)

    def qps_at(self, t: float) -> float:
        """Rate ``t`` seconds into the phase (linear between the end points)."""
        f = min(1.0, max(0.0, t / self.duration_s))
        return self.start_qps + (self.end_qps - self.start_qps) * f

    @property
    def peak_qps(self) -> float:
        return max(self.start_qps, self.end_qps)


@dataclass(frozen=True, slots=True)
class Pair:
    """The engine pair a scenario runs on, as ``specgate simulate``'s flags of the same names
    set it; None leaves a field to the command line (or its default)."""

    method: str | None = None  # --method
    k: int | None = None  # -k / --num-speculative-tokens
    spec_config: str | None = None  # --spec-config: a JSON object of more speculative-config keys
    max_num_seqs: int | None = None  # --max-num-seqs
    spec_cost_scale: float | None = None  # --spec-cost-scale: what speculation adds, × the profile's
    spec_cost_slope: float | None = None  # --spec-cost-slope: ... × (batch ÷ 8) ** this
    device_scale: float | None = None  # --device-scale: both engines' steps, × the profile's
    device_scale_slope: float | None = None  # --device-scale-slope: ... × (batch ÷ 8) ** this

    def describe(self) -> str:
        """The fields set, as the command line's flags would read (empty: the default pair)."""
        flags = ((f.name, getattr(self, f.name)) for f in fields(self))
        return " ".join(
            f"{'-k' if name == 'k' else '--' + name.replace('_', '-')} {shlex.quote(str(value))}"
            for name, value in flags
            if value is not None
        )


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    phases: tuple[Phase, ...]
    pair: Pair = Pair()

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def phase_at(self, t: float) -> tuple[Phase, float] | None:
        """The phase running at ``t`` and its start time; None past the end."""
        start = 0.0
        for p in self.phases:
            if t < start + p.duration_s:
                return p, start
            start += p.duration_s
        return None

    def scaled(self, factor: float) -> Scenario:
        """The same scenario with every phase ``factor`` times as long (short test runs)."""
        if not 0 < factor <= 1000:
            raise ValueError(f"time scale must be in (0, 1000], got {factor}")
        if factor == 1:
            return self
        ph = tuple(replace(p, duration_s=p.duration_s * factor) for p in self.phases)
        return Scenario(self.name, f"{self.description} (time × {factor:g})", ph, self.pair)

    def qps_at(self, t: float) -> float:
        at = self.phase_at(t)
        return 0.0 if at is None else at[0].qps_at(t - at[1])


def phases_from_schedule(
    schedule: Schedule, mix: str | None = None, temperature: str | None = None
) -> tuple[Phase, ...]:
    """The phases of a parsed QPS schedule (every stage needs a finite duration)."""
    if any(not math.isfinite(s.duration_s) for s in schedule.stages):
        raise ValueError("every stage of a simulated schedule needs a duration (QPS:SECONDS)")
    return tuple(Phase(s.duration_s, s.start_qps, s.end_qps, mix, temperature) for s in schedule.stages)


def from_schedule(spec: str, mix: str | None = None, temperature: str | None = None) -> Scenario:
    """A scenario from a ``--schedule`` spec (see :mod:`specgate_lab.workload.schedule`);
    ValueError if bad."""
    phases = phases_from_schedule(parse_schedule(spec), mix, temperature)
    if all(p.peak_qps <= 0 for p in phases):
        raise ValueError(f"schedule {spec!r} never sends a request")
    return Scenario("schedule", spec, phases)


def _sched(spec: str, mix: str | None, temperature: str) -> tuple[Phase, ...]:
    return phases_from_schedule(parse_schedule(spec), mix, temperature)


EDITS = "edit=1"
CHAT = "chat=1"
DAY32 = "ramp:0.5-32:300,32:60,ramp:32-0.5:300"
DAY48 = "ramp:0.5-48:300,48:60,ramp:48-0.5:300"


def _eagle3(name: str, description: str, truth: tuple[float, float, float, float], **kw: Any) -> Scenario:
    """A short EAGLE-3 day whose engines err against the profile by a batch-dependent amount:
    ``truth`` is (spec cost scale, its slope, device scale, its slope), each scale × (batch ÷ 8)
    ** its slope. Default mix, T uniform 0–1, k=3, synthetic acceptance (AL 1.6), batch cap 64."""
    rates = kw.pop("rates", (0.4, 0.15, 0.05))
    spec_config = json.dumps({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates})
    pair = Pair("eagle3", 3, spec_config, 64, *truth)
    return Scenario(name, description, _sched(kw.pop("schedule", E3DAY), None, "uniform:0:1"), pair)


# The EAGLE-3 family: days where the engines' errors against the router's profile change
# with the batch, as real GPUs' do (rounds 15-16: an H100's speculation cost 1.4 × its
# profile at 10 in flight and 1.24 × at 64). Both signs, on the spec engine alone and on
# both engines; the pair is judged on the family, not on one of them (issue 52).
E3DAY = "ramp:1-40:40,40:20,ramp:40-1:40"
EAGLE3_DAYS = (
    _eagle3(
        "eagle3-round16",
        "round 16's H100 (docs/gpu-rounds.md): speculation 2 × the profile at batch 8, its excess shrinking "
        "(slope −0.8); the device 0.96 ×, falling behind as the batch grows (0.18)",
        (2.0, -0.8, 0.96, 0.18),
    ),
    _eagle3(
        "eagle3-newuser",
        "a variant as a new user would try: speculation 1.7 × (slope −0.6), device 1.05 × (0.12), "
        "AL 1.85, a longer day to 48 QPS",
        (1.7, -0.6, 1.05, 0.12),
        rates=(0.5, 0.25, 0.1),
        schedule="ramp:1-48:50,48:25,ramp:48-1:50",
    ),
    _eagle3(
        "eagle3-spec-shrink",
        "speculation dearer than the profile at light load, nearing it at the peak: 1.6 × at "
        "batch 8, slope −0.5; the device as the profile",
        (1.6, -0.5, 1.0, 0.0),
    ),
    _eagle3(
        "eagle3-spec-grow",
        "speculation cheaper than the profile at light load, dearer at the peak: 0.7 × at batch "
        "8, slope +0.4; the device as the profile",
        (0.7, 0.4, 1.0, 0.0),
    ),
    _eagle3(
        "eagle3-device-grow",
        "both engines faster than the profile at light load, slower at the peak: device 0.9 × "
        "at batch 8, slope +0.25; speculation as the profile",
        (1.0, 0.0, 0.9, 0.25),
    ),
    _eagle3(
        "eagle3-device-shrink",
        "both engines slower than the profile at light load, faster at the peak: device 1.3 × "
        "at batch 8, slope −0.2; speculation as the profile",
        (1.0, 0.0, 1.3, -0.2),
    ),
    _eagle3(
        "eagle3-crossed",
        "speculation's error grows with the batch (0.8 ×, slope +0.5) while the device's "
        "shrinks (1.2 ×, slope −0.15)",
        (0.8, 0.5, 1.2, -0.15),
    ),
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "day32",
            "diurnal day: 0.5 → 32 → 0.5 QPS ramps, default mix, T uniform 0–1",
            _sched(DAY32, None, "uniform:0:1"),
        ),
        Scenario(
            "day48",
            "diurnal day near saturation: 0.5 → 48 → 0.5 QPS, default mix, T uniform 0–1",
            _sched(DAY48, None, "uniform:0:1"),
        ),
        Scenario("day48-copy", "day to 48 QPS of copy-heavy code edits at T=0", _sched(DAY48, EDITS, "0")),
        Scenario(
            "mix-shift",
            "1.5 QPS: edits at T=0 (180 s) → open chat at T=1 (180 s) → edits at T=0 (180 s)",
            (
                Phase(180, 1.5, 1.5, EDITS, "0"),
                Phase(180, 1.5, 1.5, CHAT, "1"),
                Phase(180, 1.5, 1.5, EDITS, "0"),
            ),
        ),
        Scenario(
            "temp-shift",
            "4 QPS of the default mix: T=0 (240 s) → T=1 (240 s) → T=0 (240 s), the same prompts",
            (Phase(240, 4, 4, None, "0"), Phase(240, 4, 4, None, "1"), Phase(240, 4, 4, None, "0")),
        ),
        Scenario(
            "load-step",
            "load step 2 → 32 → 2 QPS (240 s each), default mix, T uniform 0–1",
            _sched("2:240,32:240,2:240", None, "uniform:0:1"),
        ),
        *EAGLE3_DAYS,
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None


def describe_all() -> str:
    """One line per named scenario: name, simulated length, description (and its engine pair,
    where it names one, as flags)."""
    w = max(len(name) for name in SCENARIOS)
    return "\n".join(
        f"{s.name:<{w}} {s.duration_s / 60:5.1f} min  {s.description}"
        + (f"\n{'':<{w + 11}}{s.pair.describe()}" if s.pair.describe() else "")
        for s in SCENARIOS.values()
    )


def arrival_times(phases: tuple[Phase, ...], rng: random.Random) -> list[tuple[float, int]]:
    """Poisson arrivals of time-varying rate (thinning), as (time, phase index).

    A constant phase draws exactly as a homogeneous process would (no thinning draws).
    """
    out: list[tuple[float, int]] = []
    start = 0.0
    for i, ph in enumerate(phases):
        peak = ph.peak_qps
        end = start + ph.duration_s
        if peak > 0:
            constant = ph.start_qps == ph.end_qps
            t = start + rng.expovariate(peak)
            while t < end:
                if constant or rng.random() * peak < ph.qps_at(t - start):
                    out.append((t, i))
                t += rng.expovariate(peak)
        start = end
    return out


def scenario_requests(
    phases: tuple[Phase, ...],
    *,
    seed: int,
    mix: str | None,
    temperature: str,
    max_tokens_cap: int,
) -> list[tuple[float, WorkloadRequest]]:
    """Arrival times with their requests; identical for every policy of a run."""
    rng = random.Random(seed * 7919 + round(sum(p.peak_qps * 1000 for p in phases)))
    streams: dict[tuple[str | None, str], Iterator[WorkloadRequest]] = {}
    out: list[tuple[float, WorkloadRequest]] = []
    for t, i in arrival_times(phases, rng):
        ph = phases[i]
        key = (ph.mix if ph.mix is not None else mix, ph.temperature or temperature)
        stream = streams.get(key)
        if stream is None:
            stream = streams[key] = iter_requests(seed, None, key[0], key[1], max_tokens_cap=max_tokens_cap)
        out.append((t, next(stream)))
    return out
