"""What one routing decision costs: the fleet policy over 1 or 64 pairs, driven as the
gateway drives it.

    PYTHONPATH=.:lab python3 loadtests/decision_cost.py --pairs 1,64          # µs per decision
    PYTHONPATH=.:lab python3 loadtests/decision_cost.py --pairs 64 --save t.pkl
    PYTHONPATH=.:lab python3 loadtests/decision_cost.py --record t.pkl --repeats 1

The simulator (:func:`specgate_lab.sim.fleet.simulate_fleet`, the fleet matrix's n-gram 2..5
setup at ``--load`` of the pairs' capacity) runs once and records every call it makes on
the policy: each decision with the view it was given (the engines' loads, as the gateway
sees them), each answer learned from on completion, each flip's moves taken. The record is
then replayed ``--repeats`` times on a fresh policy, timing each decision (and each answer
learned from) alone; the decisions before ``--warmup`` s of simulated time (the learners
still empty) are left out of the figures. A replay must decide exactly as the recorded run
did (the policy is deterministic given its calls): a difference is printed and the exit
status is then 1, so the record also checks that a change to the policy left its
decisions alone.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import pickle
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.placement import FleetPolicy
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import build_policy
from specgate_lab.sim.fleet import simulate_fleet
from specgate_lab.sim.records import SimConfig

CAPACITY = 45.0  # one pair's req/s under the better static (fleet_matrix.CAPACITY)


@dataclass
class Record:
    """The calls a run made on its policy, in order: ("d", features, view, now, decision),
    ("o", outcome, now), ("m", moves), ("f", pair key)."""

    cfg: SimConfig
    calls: list[tuple[Any, ...]] = field(default_factory=list)


def _intern(table: dict[Any, Any], x: Any) -> Any:
    return table.setdefault(x, x)


@contextmanager
def recording(rec: Record) -> Iterator[None]:
    """While inside, every FleetPolicy's calls are appended to ``rec`` (equal views kept once)."""
    cls = FleetPolicy
    decide, observe, take_moves, forget = cls.decide, cls.observe, cls.take_moves, cls.forget
    seen: dict[Any, Any] = {}

    def rec_decide(self: FleetPolicy, features: Any, view: Any, now: float) -> Any:
        d = decide(self, features, view, now)
        view = type(view)(view.model, tuple(_intern(seen, p) for p in view.pairs), view.pinned)
        rec.calls.append(("d", features, view, now, d))
        return d

    def rec_observe(self: FleetPolicy, outcome: Any, now: float) -> None:
        observe(self, outcome, now)
        rec.calls.append(("o", outcome, now))

    def rec_take_moves(self: FleetPolicy) -> list[str]:
        moves = take_moves(self)
        if moves:
            rec.calls.append(("m", list(moves)))
        return moves

    def rec_forget(self: FleetPolicy, key: str) -> None:
        forget(self, key)
        rec.calls.append(("f", key))

    patched = {
        "decide": rec_decide,
        "observe": rec_observe,
        "take_moves": rec_take_moves,
        "forget": rec_forget,
    }
    saved = {k: getattr(cls, k) for k in patched}
    for k, v in patched.items():
        setattr(cls, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(cls, k, v)


def record(pairs: int, load: float, duration: float, seed: int) -> Record:
    cfg = SimConfig(
        qps=round(load * pairs * CAPACITY, 2),
        duration_s=duration,
        seed=seed,
        prompt_lookup_min=2,
        prompt_lookup_max=5,
        pairs=pairs,
        drain_s=1.0,
    )
    rec = Record(cfg)
    with recording(rec):
        simulate_fleet(cfg)
    return rec


def fresh_policy(cfg: SimConfig) -> FleetPolicy:
    """The policy :func:`simulate_fleet` builds for an adaptive run."""
    rcfg = RoutingConfig.model_validate({"policy": "adaptive", "profile": cfg.profile, **cfg.routing})
    primary = build_policy(rcfg)
    assert isinstance(primary, AdaptivePolicy)
    return FleetPolicy(primary)


@dataclass
class Replay:
    decide_s: list[tuple[float, float]] = field(default_factory=list)  # (simulated time, s)
    learn_s: list[float] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)


def replay(rec: Record) -> Replay:
    pol = fresh_policy(rec.cfg)
    out = Replay()
    clock = time.perf_counter
    for call in rec.calls:
        op = call[0]
        if op == "d":
            _, features, view, now, want = call
            t0 = clock()
            got = pol.decide(features, view, now)
            out.decide_s.append((now, clock() - t0))
            if got != want and len(out.differ) < 10:
                out.differ.append(f"t={now:.6f}: {got} != recorded {want}")
        elif op == "o":
            t0 = clock()
            pol.observe(call[1], call[2])
            out.learn_s.append(clock() - t0)
        elif op == "m":
            got_moves = pol.take_moves()
            if got_moves != call[1] and len(out.differ) < 10:
                out.differ.append(f"moves {got_moves} != recorded {call[1]}")
        else:
            pol.forget(call[1])
    return out


def pcts(xs: list[float]) -> dict[str, float]:
    us = sorted(1e6 * x for x in xs)
    if not us:
        return {"p50_us": math.nan, "p99_us": math.nan, "mean_us": math.nan}
    return {
        "p50_us": round(us[len(us) // 2], 1),
        "p99_us": round(us[int(0.99 * (len(us) - 1))], 1),
        "mean_us": round(statistics.fmean(us), 1),
    }


def measure(rec: Record, repeats: int, warmup: float) -> tuple[dict[str, Any], list[str]]:
    """Per replay its decisions' p50/p99/mean (µs) after the warm-up, and its answers'."""
    runs, differ = [], []
    gc.collect()
    gc.freeze()  # the record is the bench's, not the gateway's: collections leave it alone
    for _ in range(max(1, repeats)):
        r = replay(rec)
        differ += r.differ
        kept = [dt for t, dt in r.decide_s if t >= warmup]
        runs.append({"decisions": len(kept), **pcts(kept), "learn": pcts(r.learn_s)})
    return {"pairs": rec.cfg.pairs, "qps": rec.cfg.qps, "runs": runs}, differ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", default="64", help="comma-separated pair counts")
    ap.add_argument("--load", type=float, default=0.5, help="share of the pairs' capacity offered")
    ap.add_argument("--duration", type=float, default=None, help="s of arrivals (default: 30 / 6 s)")
    ap.add_argument("--warmup", type=float, default=None, help="s left out (default: duration / 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="replays of the record")
    ap.add_argument("--save", type=Path, default=None, help="write the record here (one --pairs)")
    ap.add_argument("--record", type=Path, default=None, help="replay this saved record instead")
    args = ap.parse_args(argv)
    if args.record is not None:
        records = [Record(*pickle.loads(args.record.read_bytes()))]
    else:
        records = []
        for n in (int(x) for x in args.pairs.split(",") if x):
            duration = args.duration or (30.0 if n < 8 else 6.0)  # ~ a few thousand decisions
            records.append(record(n, args.load, duration, args.seed))
        if args.save is not None:
            args.save.write_bytes(pickle.dumps((records[0].cfg, records[0].calls)))
    failed = False
    for rec in records:
        warmup = args.warmup if args.warmup is not None else rec.cfg.duration_s / 3
        result, differ = measure(rec, args.repeats, warmup)
        print(json.dumps(result))
        for d in differ:
            print("DIFFERS", d)
        failed |= bool(differ)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
