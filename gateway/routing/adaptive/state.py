"""The adaptive policy's state as GET /admin/state and the telemetry collector read it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gateway.routing.adaptive.cluster import Cluster
from gateway.routing.adaptive.controller import RegimeController
from gateway.routing.adaptive.estimate import Estimator
from gateway.routing.adaptive.knobs import REPORT_DIGITS
from gateway.routing.adaptive.overrides.probe import Prober

MODE_KEY = "all"  # one mode per model (the pair serves all classes in one regime)


def _r(x: float) -> float:
    return round(x, REPORT_DIGITS)


def policy_state(
    name: str,
    est: Estimator,
    ctl: RegimeController,
    cluster: Cluster,
    prober: Prober,
    reasons: Mapping[str, int],
    recent: Iterable[dict[str, object]],
) -> dict[str, object]:
    """JSON-serialisable state of the policy's parts (figures rounded)."""
    live = est.live
    now = live.last_update if math.isfinite(live.last_update) else 0.0
    c = est.last_costs
    m, p = ctl.mode, prober
    mode = "speculating" if m.speculating else "fallback"
    return {
        "policy": name,
        "method": est.method,
        "k": est.k,
        "mode": mode,
        "modes": {
            MODE_KEY: {
                "mode": mode,
                "predicted_speedup": None if m.last is None else _r(m.last),
                "evidence_against": _r(m.against),
                "prediction_noise": _r(m.noise),  # the band widens by it
                "flips": m.flips,
            }
        },
        "context_tokens": round(est.context.mean()),
        "break_even_tokens_per_step": None if c is None else _r(c.break_even_tokens_per_step),
        "last_predicted_speedup": None if c is None else _r(c.speedup),
        "mix_tokens_per_step": _r(1.0 / est.inv_e_mix()),
        "mix_verified_tokens_per_step": _r(est.q_mix()),
        "live_acceptance_ratio": _r(live.ratio),
        "live_draft_ratio": _r(live.q_ratio),
        "step_scale": {"spec": _r(live.scale_spec), "base": _r(live.scale_base)},
        "measured_vs_model": est.bias.snapshot(now),
        "learned": est.learner.snapshot(now),
        # other gateway replicas' requests seen on the pair within the last minute
        "shared_pair": cluster.pair.shared(now),
        "probe_share": _r(p.probes / p.eligible) if p.eligible else 0.0,
        "probes": p.probes,
        "reasons": dict(reasons),
        "recent_decisions": list(recent),
    }
