"""The offline oracle: the best fixed assignment of request classes to pairs, by search.

A candidate sends the requests of a set of classes (workload kinds) to ``s`` pairs that
all speculate and the rest to the other ``N − s`` pairs, all plain, least-loaded within
each pool (:class:`~gateway.sim.fleet.Assigned`); ``s = 0`` and ``s = N`` are the two
static fleets. The search knows what no gateway does: each request's true class, and the
whole run. Classes are ordered by the tokens per step their requests' priors promise (the
prefix of that order is what gains most from speculation); for each prefix the number of
speculating pairs is searched (every count on a small fleet; a ternary search on a large
one, the mean time per token being unimodal in it). Every candidate is a full simulated
run on the same arrivals; the best by mean time per token is the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gateway.physics.methods import NGRAM_METHODS
from gateway.routing.acceptance import ngram_prior, prior_tokens_per_step
from gateway.sim.fleet import ASSIGN, simulate_fleet
from gateway.sim.records import SimConfig, SimResult
from gateway.sim.run import arrivals, parse_workload
from gateway.workload import WorkloadRequest

Row = dict[str, float | int | str]
_FULL_SEARCH = 6  # fleets up to this many pairs try every count of speculating pairs


def kinds_by_gain(cfg: SimConfig, work: list[tuple[float, WorkloadRequest]]) -> list[str]:
    """The workload's kinds, most tokens per spec step (by their requests' priors) first."""
    sums: dict[str, list[float]] = {}
    for _, wr in work:
        f = parse_workload(wr).features
        if cfg.method in NGRAM_METHODS:
            e = ngram_prior(f.overlap, f.temperature, cfg.k)[0]
        else:
            e = prior_tokens_per_step(cfg.method, f.overlap, f.temperature, cfg.k)
        sums.setdefault(wr.kind, []).append(e)
    return sorted(sums, key=lambda k: -sum(sums[k]) / len(sums[k]))


def assignment(kinds: list[str], spec_pairs: int) -> str:
    return f"{ASSIGN}{'+'.join(kinds)}:{spec_pairs}"


def search(
    cfg: SimConfig,
    work: list[tuple[float, WorkloadRequest]] | None = None,
    run: Callable[[SimConfig, list[tuple[float, WorkloadRequest]]], SimResult] = simulate_fleet,
) -> tuple[Row, list[Row]]:
    """(the oracle's row, every candidate's row) for ``cfg``'s fleet and load."""
    work = work if work is not None else arrivals(cfg)
    order = kinds_by_gain(cfg, work)
    n = max(1, cfg.pairs)
    tried: dict[str, Row] = {}

    def tpot(kinds: list[str], s: int) -> float:
        name = assignment(kinds if 0 < s < n else (order if s == n else []), s)
        if name not in tried:
            row = run(replace(cfg, policy=name), work).summary()
            row["assignment"] = name
            tried[name] = row
        return float(tried[name]["mean_tpot_ms"])

    tpot([], 0)
    tpot(order, n)
    for cut in range(1, len(order)):
        kinds = order[:cut]
        if n - 1 <= _FULL_SEARCH:
            for s in range(1, n):
                tpot(kinds, s)
            continue
        lo, hi = 1, n - 1
        while hi - lo > 2:
            a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
            if tpot(kinds, a) <= tpot(kinds, b):
                hi = b
            else:
                lo = a
        for s in range(lo, hi + 1):
            tpot(kinds, s)
    rows = list(tried.values())
    best = dict(min(rows, key=lambda r: float(r["mean_tpot_ms"])))
    best["policy"] = "oracle"
    return best, rows
