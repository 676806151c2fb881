"""Per-request records of a load run and their summary (TTFT, TPOT, throughput, goodput)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. Times in seconds; ``start`` on the client's clock."""

    start: float
    kind: str
    subkind: str
    temperature: float
    ok: bool
    status: int = 0
    ttft: float | None = None  # first output delta (content, reasoning or tool call)
    e2e: float | None = None
    output_tokens: int = 0  # from the usage chunk when present, else output deltas
    chunks: int = 0  # output deltas received (content, reasoning, tool calls)
    route: str = ""  # x-specgate-route response header (spec/base), when the gateway sets it
    reason: str = ""  # x-specgate-reason
    error: str = ""
    lateness: float = 0.0  # how late the request left compared with its scheduled arrival
    stage: int = 0
    engine: str = ""  # x-specgate-engine: the engine that served it (its pair, on a fleet)

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return max(0.0, self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def tokens_per_s(self) -> float | None:
        if self.e2e is None or self.e2e <= 0 or self.output_tokens < 1:
            return None
        return self.output_tokens / self.e2e

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot"] = self.tpot
        d["tokens_per_s"] = self.tokens_per_s
        return d


CSV_FIELDS: tuple[str, ...] = (*(f.name for f in fields(RequestRecord)), "tpot", "tokens_per_s")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linearly interpolated percentile, ``q`` a whole number in 0..100; None for no values.

    :func:`statistics.quantiles` with ``method="inclusive"``: the value at rank
    ``(n - 1) * q / 100`` of the sorted values, interpolated between its neighbours (numpy's
    default ``linear``). The simulator's summaries use a sample value instead
    (:func:`specgate_lab.sim.analysis.pct`).
    """
    if not 0 <= q <= 100 or q != int(q):
        raise ValueError(f"percentile needs a whole q in 0..100, got {q!r}")
    if not values:
        return None
    if len(values) == 1 or q in (0, 100):
        return min(values) if q == 0 else max(values)
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(
    records: Iterable[RequestRecord],
    duration_s: float,
    *,
    tpot_slo_s: float | None = None,
    ttft_slo_s: float | None = None,
) -> dict[str, Any]:
    """Aggregate stats of records over a window of ``duration_s`` seconds.

    Goodput counts requests/s that succeeded within both SLOs (when given).
    """
    recs = list(records)
    ok = [r for r in recs if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    tpot = [t for t in (r.tpot for r in ok) if t is not None]
    e2e = [r.e2e for r in ok if r.e2e is not None]
    tokens = sum(r.output_tokens for r in ok)

    def good(r: RequestRecord) -> bool:
        if tpot_slo_s is not None and (r.tpot is None or r.tpot > tpot_slo_s):
            return False
        return not (ttft_slo_s is not None and (r.ttft is None or r.ttft > ttft_slo_s))

    routes: dict[str, int] = {}
    for r in ok:
        if r.route:
            routes[r.route] = routes.get(r.route, 0) + 1
    d = max(duration_s, 1e-9)
    return {
        "requests": len(recs),
        "failures": len(recs) - len(ok),
        "achieved_qps": len(recs) / d,
        "ttft_mean_s": _mean(ttft),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_mean_s": _mean(tpot),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p99_s": percentile(tpot, 99),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p99_s": percentile(e2e, 99),
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / d,
        "goodput_rps": sum(1 for r in ok if good(r)) / d,
        "route_share": {k: v / len(ok) for k, v in sorted(routes.items())} if ok else {},
        "lateness_p99_s": percentile([r.lateness for r in recs], 99),
    }
