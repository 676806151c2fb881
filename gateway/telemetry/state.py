"""Live routing state per model, read at scrape time by a custom Prometheus collector.

The gateway registers a *state source*: a callable returning one :class:`ModelState` per
model (the routing core's :class:`~gateway.routing.types.ModelView` plus the policy's
``snapshot()``). Nothing is copied on the request path; the collector reads the current
state only when Prometheus scrapes ``/metrics``.

Policy snapshot keys read (all optional; a missing key exports no sample, never a zero):

- ``policy`` (str), ``mode`` (str); without ``mode``, the model's mode is derived from
  ``modes`` (``{class: {"mode": "speculating"|"fallback", "smoothed_speedup": x}}``):
  ``speculating`` when every class speculates, ``fallback`` when none does, else ``mixed``
- ``probe_share`` (0..1)
- ``break_even_acceptance`` (acceptance rate below which speculation stops paying at the
  current load), ``break_even_tokens_per_step`` / ``break_even_acceptance_length`` (the
  same as a mean acceptance length)
- ``last_predicted_speedup`` / ``predicted_speedup`` (>1 favours the speculative engine)
- ``learned`` (``{class: {"tokens_per_step": x}}``)
- the adaptive policy's cost-model figures, each a gauge of its own (:data:`NAMED_GAUGES`:
  ``context_tokens``, ``mix_tokens_per_step``, ``mix_verified_tokens_per_step``,
  ``live_acceptance_ratio``, ``live_draft_ratio``), ``step_scale`` (``{route: x}``) and
  ``probes`` (a count). Other keys are not exported (``GET /admin/state`` shows them all).
- per pair (:mod:`.pairs`): each pair's regime and load, the fleet's count of speculating
  pairs and the planner's (``fleet``, else ``mode`` on a model of one pair).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.routing.types import EngineView, ModelView
from gateway.telemetry.labels import LabelGuard, clean
from gateway.telemetry.pairs import PairFamilies

log = logging.getLogger("specgate.telemetry")

_ALIASES: dict[str, tuple[str, ...]] = {
    "probe_share": ("probe_share",),
    "break_even_acceptance": ("break_even_acceptance", "break_even_acceptance_rate", "break_even_alpha"),
    "break_even_acceptance_length": (
        "break_even_tokens_per_step",
        "break_even_acceptance_length",
        "break_even_al",
    ),
    "predicted_speedup": ("last_predicted_speedup", "predicted_speedup", "speedup"),
}
# snapshot key -> (metric name, help): numbers of the adaptive policy's snapshot.
NAMED_GAUGES: dict[str, tuple[str, str]] = {
    "context_tokens": (
        "specgate_routing_context_tokens",
        "Mean context (prompt tokens) of the model's recent requests: where the step-time profile is read.",
    ),
    "mix_tokens_per_step": (
        "specgate_routing_mix_tokens_per_step",
        "Expected tokens per speculative step over the recent traffic mix (what the regimes are priced on).",
    ),
    "mix_verified_tokens_per_step": (
        "specgate_routing_mix_verified_tokens_per_step",
        "Tokens a speculative step verifies per sequence (1 + drafts) over the recent traffic mix.",
    ),
    "live_acceptance_ratio": (
        "specgate_routing_live_acceptance_ratio",
        "The speculative engine's windowed acceptance over what the router expected of the traffic it "
        "sent there (1: as predicted).",
    ),
    "live_draft_ratio": (
        "specgate_routing_live_draft_ratio",
        "The speculative engine's drafted tokens per step over what was expected (1: as predicted).",
    ),
}


@dataclass(frozen=True, slots=True)
class ModelState:
    """What the collector needs about one model at scrape time."""

    model: str
    view: ModelView | None = None
    policy: Mapping[str, object] = field(default_factory=dict)


StateSource = Callable[[], Iterable[ModelState]]


def _num(x: object) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _pick(snapshot: Mapping[str, object], name: str) -> float | None:
    for key in _ALIASES[name]:
        v = _num(snapshot.get(key))
        if v is not None:
            return v
    return None


class _Families:
    def __init__(self) -> None:
        g = GaugeMetricFamily
        self.up = g(
            "specgate_engine_up",
            "1 when the engine is healthy and not draining.",
            labels=["model", "engine", "route"],
        )
        self.stale = g(
            "specgate_engine_stale",
            "1 when the gateway treats the engine's scraped metrics as too old or missing.",
            labels=["model", "engine", "route"],
        )
        self.info = g(
            "specgate_engine_info",
            "Engines of each model: route, speculative method and draft length.",
            labels=["model", "engine", "route", "method", "k"],
        )
        self.tpot = g(
            "specgate_engine_time_per_output_token_seconds",
            "Windowed per-output-token latency of the engine as the routing core sees it.",
            labels=["model", "engine", "route"],
        )
        self.acc = g(
            "specgate_spec_acceptance_rate",
            "Windowed draft acceptance rate of the speculative engine (gateway's view).",
            labels=["model", "engine"],
        )
        self.al = g(
            "specgate_spec_mean_acceptance_length",
            "Windowed mean acceptance length (1 + accepted / drafts) of the speculative engine.",
            labels=["model", "engine"],
        )
        self.pos = g(
            "specgate_spec_position_acceptance_rate",
            "Windowed acceptance rate of each draft position of the speculative engine.",
            labels=["model", "engine", "position"],
        )
        self.mode = g(
            "specgate_routing_mode",
            "Current routing mode of the model (1 = active).",
            labels=["model", "mode"],
        )
        self.policy = g(
            "specgate_routing_policy_info", "Routing policy of each model.", labels=["model", "policy"]
        )
        self.pinned = g(
            "specgate_routing_pinned",
            "Route pinned by the operator (auto = not pinned).",
            labels=["model", "pin"],
        )
        self.probe = g(
            "specgate_routing_probe_share",
            "Share of traffic sent to probe the other engine.",
            labels=["model"],
        )
        self.be_acc = g(
            "specgate_routing_break_even_acceptance_rate",
            "Predicted acceptance rate at which speculation breaks even at the current load.",
            labels=["model"],
        )
        self.be_al = g(
            "specgate_routing_break_even_acceptance_length",
            "Predicted mean acceptance length at which speculation breaks even at the current load.",
            labels=["model"],
        )
        self.speedup = g(
            "specgate_routing_predicted_speedup",
            "Predicted speculative speed-up for the model's typical request at the current load.",
            labels=["model"],
        )
        self.class_mode = g(
            "specgate_routing_class_mode",
            "Routing mode of each request class (kind/temperature bucket), 1 = active.",
            labels=["model", "class", "mode"],
        )
        self.class_speedup = g(
            "specgate_routing_class_smoothed_speedup",
            "Smoothed predicted speculative speed-up of each request class.",
            labels=["model", "class"],
        )
        self.learned = g(
            "specgate_routing_learned_tokens_per_step",
            "Learned expected tokens per speculative step of each request class.",
            labels=["model", "class"],
        )
        self.named = {key: g(name, doc, labels=["model"]) for key, (name, doc) in NAMED_GAUGES.items()}
        self.step_scale = g(
            "specgate_routing_step_time_scale",
            "Measured step time of each engine over the step-time profile's (1: as profiled), by route.",
            labels=["model", "route"],
        )
        self.probes = CounterMetricFamily(
            "specgate_routing_probes",
            "Requests sent to the speculative engine as probes while the model was in fallback.",
            labels=["model"],
        )
        self.pairs = PairFamilies()

    def all(self) -> list[Metric]:
        return [
            self.up,
            self.stale,
            self.info,
            self.tpot,
            self.acc,
            self.al,
            self.pos,
            self.mode,
            self.policy,
            self.pinned,
            self.probe,
            self.be_acc,
            self.be_al,
            self.speedup,
            self.class_mode,
            self.class_speedup,
            self.learned,
            *self.named.values(),
            self.step_scale,
            self.probes,
            *self.pairs.all(),
        ]


class RoutingStateCollector(Collector):
    """Exports the live routing state of every model from a :data:`StateSource`."""

    def __init__(self, source: StateSource | None = None, max_label_values: int = 64) -> None:
        self.source = source
        self._modes = LabelGuard(max_label_values)
        self._classes = LabelGuard(max_label_values)

    def describe(self) -> Iterable[Metric]:
        return _Families().all()

    def collect(self) -> Iterable[Metric]:
        fam = _Families()
        source = self.source
        if source is None:
            return fam.all()
        try:
            states = list(source())
        except Exception:
            log.exception("routing state source failed; exporting no routing state this scrape")
            return fam.all()
        for st in states:
            try:
                self._model(fam, st)
            except Exception:
                log.exception("bad routing state for a model; skipped")
        return fam.all()

    def _model(self, fam: _Families, st: ModelState) -> None:
        m = clean(st.model)
        if st.view is not None:
            fam.pinned.add_metric([m, clean(st.view.pinned.value)], 1.0)
            seen: set[str] = set()
            for pair in st.view.pairs:
                for ev in pair.engines:
                    if ev.name not in seen:
                        seen.add(ev.name)
                        self._engine(fam, m, ev)
            fam.pairs.add(m, st.view, st.policy)
        snap = st.policy
        if isinstance(snap.get("policy"), str):
            fam.policy.add_metric([m, clean(snap["policy"])], 1.0)
        mode = snap.get("mode")
        classes = snap.get("modes")
        if isinstance(classes, Mapping):
            states: list[bool] = []
            for cls, info in classes.items():
                if not isinstance(info, Mapping) or not isinstance(info.get("mode"), str):
                    continue
                c = self._classes(cls)
                states.append(info["mode"] == "speculating")
                fam.class_mode.add_metric([m, c, self._modes(info["mode"])], 1.0)
                v = _num(info.get("smoothed_speedup"))
                if v is not None:
                    fam.class_speedup.add_metric([m, c], v)
            if not isinstance(mode, str) and states:
                mode = "speculating" if all(states) else "fallback" if not any(states) else "mixed"
        if isinstance(mode, str):
            fam.mode.add_metric([m, self._modes(mode)], 1.0)
        learned = snap.get("learned")
        if isinstance(learned, Mapping):
            for cls, info in learned.items():
                v = _num(info.get("tokens_per_step")) if isinstance(info, Mapping) else None
                if v is not None:
                    fam.learned.add_metric([m, self._classes(cls)], v)
        for target, name in (
            (fam.probe, "probe_share"),
            (fam.be_acc, "break_even_acceptance"),
            (fam.be_al, "break_even_acceptance_length"),
            (fam.speedup, "predicted_speedup"),
        ):
            v = _pick(snap, name)
            if v is not None:
                target.add_metric([m], v)
        for key, gauge in fam.named.items():
            v = _num(snap.get(key))
            if v is not None:
                gauge.add_metric([m], v)
        scales = snap.get("step_scale")
        if isinstance(scales, Mapping):
            for route in ("spec", "base"):
                v = _num(scales.get(route))
                if v is not None:
                    fam.step_scale.add_metric([m, route], v)
        v = _num(snap.get("probes"))
        if v is not None:
            fam.probes.add_metric([m], v)

    @staticmethod
    def _engine(fam: _Families, m: str, ev: EngineView) -> None:
        e, r = clean(ev.name), ev.route.value
        fam.up.add_metric([m, e, r], 1.0 if ev.usable else 0.0)
        fam.stale.add_metric([m, e, r], 1.0 if ev.stale else 0.0)
        fam.info.add_metric([m, e, r, clean(ev.method or "none"), str(ev.k)], 1.0)
        st = ev.stats
        if st.tpot_s is not None and math.isfinite(st.tpot_s):
            fam.tpot.add_metric([m, e, r], st.tpot_s)
        if st.acceptance_rate is not None:
            fam.acc.add_metric([m, e], st.acceptance_rate)
        if st.mean_acceptance_length is not None:
            fam.al.add_metric([m, e], st.mean_acceptance_length)
        for i, rate in enumerate(st.per_position or ()):
            fam.pos.add_metric([m, e, str(i)], rate)
