"""The offline oracle: the best fixed assignment of request classes to pairs, by search.

A candidate sends the requests of a set of classes (workload kinds) to ``s`` pairs that
all speculate and the rest to the other ``N − s`` pairs, all plain, least-loaded within
each pool (:class:`~specgate_lab.sim.fleet.Assigned`); ``s = 0`` and ``s = N`` are the two
static fleets. The search knows what no gateway does: each request's true class, and the
whole run. The two static fleets run first; classes are then ordered by what speculation
bought each of them there (its time per token on the speculating fleet ÷ on the plain one),
and each prefix of that order is tried on each count of speculating pairs (every count on a
small fleet; a grid of about eight counts on a large one). Every candidate is a full
simulated run on the same arrivals; the best by mean time per token is the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gateway.physics.methods import NGRAM_METHODS
from gateway.routing.acceptance import ngram_prior, prior_tokens_per_step
from specgate_lab.sim.fleet import ASSIGN, simulate_fleet
from specgate_lab.sim.records import SimConfig, SimResult
from specgate_lab.sim.run import arrivals, parse_workload
from specgate_lab.workload import WorkloadRequest

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


def kind_tpot(result: SimResult) -> dict[str, float]:
    """Mean time per token per workload kind (ms) of a run's measured requests."""
    by: dict[str, list[float]] = {}
    for r in result.records:
        if r.arrival >= result.config.warmup_s and r.tpot_s is not None:
            by.setdefault(r.kind, []).append(r.tpot_s)
    return {k: 1e3 * sum(v) / len(v) for k, v in by.items()}


def by_measured_gain(spec: dict[str, float], base: dict[str, float], fallback: list[str]) -> list[str]:
    """Kinds ordered by what speculation bought them in the two static fleets (spec ÷ plain
    time per token, lowest first); kinds one run lacks keep the ``fallback`` order, last."""
    known = sorted((k for k in fallback if k in spec and k in base), key=lambda k: spec[k] / base[k])
    return known + [k for k in fallback if k not in known]


def assignment(kinds: list[str], spec_pairs: int) -> str:
    return f"{ASSIGN}{'+'.join(kinds)}:{spec_pairs}"


def candidates(order: list[str], pairs: int) -> list[str]:
    """Every candidate's policy name: the two static fleets, then each prefix of ``order``
    on each count of speculating pairs (every count up to :data:`_FULL_SEARCH` pairs, else
    a grid of about eight counts)."""
    n = max(1, pairs)
    out = [assignment([], 0), assignment(order, n)]
    step = 1 if n - 1 <= _FULL_SEARCH else max(1, n // 8)
    counts = sorted({*range(step, n, step), 1, n - 1} - {0, n})
    for cut in range(1, len(order)):
        out += [assignment(order[:cut], s) for s in counts]
    return out


def search(
    cfg: SimConfig,
    work: list[tuple[float, WorkloadRequest]] | None = None,
    run: Callable[[SimConfig, list[tuple[float, WorkloadRequest]]], SimResult] = simulate_fleet,
) -> tuple[Row, list[Row]]:
    """(the oracle's row, every candidate's row) for ``cfg``'s fleet and load: the two
    static fleets first, whose per-kind times order the kinds for the rest."""
    work = work if work is not None else arrivals(cfg)
    prior = kinds_by_gain(cfg, work)
    names = candidates(prior, cfg.pairs)
    rows, per_kind = [], []
    for name in names[:2]:
        result = run(replace(cfg, policy=name), work)
        per_kind.append(kind_tpot(result))
        rows.append({**result.summary(), "assignment": name})
    order = by_measured_gain(per_kind[1], per_kind[0], prior)
    for name in candidates(order, cfg.pairs)[2:]:
        rows.append({**run(replace(cfg, policy=name), work).summary(), "assignment": name})
    return best_of(rows), rows


def best_of(rows: list[Row]) -> Row:
    """The oracle's row: the candidate with the lowest mean time per token."""
    best = dict(min(rows, key=lambda r: float(r["mean_tpot_ms"])))
    best["policy"] = "oracle"
    return best
