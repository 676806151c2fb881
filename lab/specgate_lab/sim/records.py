"""What one simulated run is given and what it gives back: :class:`SimConfig` (the load,
the policy and the truth the engines run on, against the profile the router assumes),
:class:`RequestRecord` per request and :class:`SimResult` with its summary; the run itself is
:func:`specgate_lab.sim.run.simulate`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specgate_lab.sim.agreement import Sample, agreement
from specgate_lab.sim.analysis import pct
from specgate_lab.sim.scenarios import Phase


@dataclass(frozen=True)
class SimConfig:
    qps: float
    policy: str = "adaptive"
    duration_s: float = 120.0
    seed: int = 1
    mix: str | None = None  # workload kind mix (None: the corpus default)
    temperature: str = "uniform:0:1"
    profile: str = "h200-qwen3-8b"
    method: str = "ngram"
    k: int = 5
    # n-gram sizes of the prompt-lookup proposer (ignored by model-based methods); vLLM's
    # defaults when --speculative-config sets neither (the emulated pair of `specgate emulate
    # --pair` / `specgate bench` declares 2..5, which drafts more often).
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    # The spec engine's truth against the router's profile: what speculation adds to a step
    # (verification beyond one token, drafting) × this. 1 = the router's prior is right.
    spec_cost_scale: float = 1.0
    spec_cost_slope: float = 0.0  # ...times (batch ÷ 8) ** this (EngineConfig.spec_cost_slope)
    # Both engines' truth against the router's profile: every step x this (another GPU).
    device_scale: float = 1.0
    device_scale_slope: float = 0.0  # ...times (batch ÷ 8) ** this
    spec_overhead_ms: float = 0.0  # ...and host time every spec step adds beyond the profile's
    # More of the speculative config (vLLM's --speculative-config keys), e.g. synthetic
    # acceptance rates; merged over method and k.
    spec_extra: dict[str, object] = field(default_factory=dict)
    max_num_seqs: int = 256  # both engines' scheduler cap
    max_tokens_cap: int = 1024
    drain_s: float = 300.0  # stop this long after the last arrival even if requests remain
    # Requests arriving before this are run but left out of the summary (the run starts
    # from idle engines; every policy is measured on the same later arrivals).
    warmup_s: float = 15.0
    # Optional time-varying traffic (load, mix, temperature) replacing qps/duration_s.
    phases: tuple[Phase, ...] = ()
    routing: dict[str, object] = field(default_factory=dict)  # extra RoutingConfig fields
    # The dynamic-sd setup's num_speculative_tokens_per_batch_size: K=k up to batch 32, then
    # K=0 (plain decoding plus the measured overhead of the speculative machinery).
    dynamic_k: tuple[tuple[int, int, int], ...] = ((1, 32, 5), (33, 1 << 20, 0))
    # Gateway replicas in front of the pair, each with its own policy, taking arrivals in
    # turn (client-side round robin); they share only what the engines show (scrapes).
    replicas: int = 1
    replicas_reported: bool = False  # whether summaries carry the replicas' agreement
    # Replicas joined by a peer channel (``routing.peers``): each hears the others' requests
    # in flight, decisions and outcomes this long after they happen, and follows the
    # regime replica 0 (the leader) publishes. Off: they share only the engines' scrapes.
    peers: bool = False
    peer_lag_s: float = 0.002
    # Bodies carry each request's seed, as the scenario bench sends them (so that a sampled
    # answer is the same draw for every policy); the gateway then moves no sampled stream.
    seeded_bodies: bool = False
    # A fleet (specgate_lab.sim.fleet): this many pairs, each on its own device (qps: the total),
    # and pairs lost (-1) or added (+1) at given times.
    pairs: int = 1
    pair_events: tuple[tuple[float, int], ...] = ()


@dataclass
class RequestRecord:
    arrival: float
    kind: str
    subkind: str
    predicted_kind: str
    temperature: float
    route: str
    reason: str
    probe: bool
    output_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    finished_at: float | None = None
    steps: int = 0  # engine emissions that carried tokens
    replica: int = 0  # which gateway replica routed it
    migrated: bool = False  # moved to the sibling engine at a mode flip
    engine: str = ""  # the engine it ran on last (fleet runs: which pair, e.g. "spec3")


@dataclass
class SimResult:
    config: SimConfig
    records: list[RequestRecord]
    policy_state: dict[str, object]
    sim_end: float
    # Sampled every 0.1 s: the replicas' modes (None for policies without a mode) and the
    # requests running on the spec and the plain engine.
    samples: list[Sample] = field(default_factory=list)

    def replica_summary(self, warmup_s: float | None = None) -> dict[str, float]:
        """How far the replicas agree (:func:`specgate_lab.sim.agreement.agreement`)."""
        return agreement(self.samples, self.config.warmup_s if warmup_s is None else warmup_s)

    def summary(self, warmup_s: float | None = None) -> dict[str, float | int | str]:
        w = self.config.warmup_s if warmup_s is None else warmup_s
        records = [r for r in self.records if r.arrival >= w]
        done = [r for r in records if r.finished_at is not None]
        tpots = sorted(r.tpot_s for r in done if r.tpot_s is not None)
        ttfts = sorted(r.ttft_s for r in done if r.ttft_s is not None)
        toks = sum(r.output_tokens for r in done)
        span = max((r.finished_at or 0.0) for r in done) - w if done else 0.0
        n = len(records)
        spec = sum(1 for r in records if r.route == "spec")
        return {
            "policy": self.config.policy,
            "qps": self.config.qps,
            "requests": n,
            "finished": len(done),
            "mean_tpot_ms": 1e3 * _mean(tpots),
            "p99_tpot_ms": 1e3 * pct(tpots, 0.99),
            "mean_ttft_ms": 1e3 * _mean(ttfts),
            "p99_ttft_ms": 1e3 * pct(ttfts, 0.99),
            "output_tok_s": toks / span if span > 0 else 0.0,
            "spec_share": spec / n if n else 0.0,
            "probe_share": sum(1 for r in records if r.probe) / n if n else 0.0,
        }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
