"""The advice as Prometheus metrics, computed at each ``/metrics`` scrape (nothing on the
request path). Labels are bounded: the configured models, the gateway's request kinds,
four temperature buckets and a fixed set of loads."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.advisor.report import Advice, bucket_edges
from gateway.routing.steptime import get_step_model

LOADS = (1.0, 8.0, 32.0, 64.0, 128.0)


def temperature_label(b: int) -> str:
    """A temperature bucket as a plain label value: ``0-0.05``, ``0.05-0.35``, …, ``0.75+``."""
    lo, hi = bucket_edges(b)
    return f"{lo or 0.0:g}-{hi:g}" if hi is not None else f"{lo:g}+"


class AdviceCollector(Collector):
    """Exports, per model, what the sampled answers' n-gram replays say (``advice()``:
    model → :class:`Advice`; ``profiles``: model → the step-time profile it is priced on)."""

    def __init__(self, advice: Callable[[], Mapping[str, Advice]], profiles: Mapping[str, str]) -> None:
        self.advice = advice
        self.profiles = dict(profiles)

    def describe(self) -> Iterable[Metric]:
        return []  # described by collect() at registration time would touch live state

    def collect(self) -> Iterable[Metric]:
        cls_labels = ["model", "proposer", "kind", "temperature"]
        answers = CounterMetricFamily(  # exposed as specgate_advice_answers_total
            "specgate_advice_answers",
            "Answers replayed through the proposers so far (a count: rate() gives answers a second).",
            labels=["model"],
        )
        acc = GaugeMetricFamily(
            "specgate_advice_acceptance_rate",
            "Share of the drafted tokens the proposer (ngram, suffix) would have had accepted.",
            labels=cls_labels,
        )
        tps = GaugeMetricFamily(
            "specgate_advice_tokens_per_step",
            "Answer tokens a speculative step of the proposer would emit, over whole answers.",
            labels=cls_labels,
        )
        speedup = GaugeMetricFamily(
            "specgate_advice_predicted_speedup",
            "Predicted plain ÷ speculative time per output token over all the traffic, "
            "by requests in flight.",
            labels=["model", "proposer", "load"],
        )
        for model, adv in sorted(self.advice().items()):
            answers.add_metric([model], float(adv.requests))
            if adv.requests == 0:
                continue
            profile = self.profiles.get(model)
            steps = (
                None
                if profile is None
                else get_step_model(profile, max(1, round(adv.ngram.total.context_tokens)))
            )
            for pa in adv.proposers():
                for (kind, b), cs in sorted(pa.classes.items()):
                    labels = [model, pa.method, kind, temperature_label(b)]
                    if cs.acceptance_rate is not None:
                        acc.add_metric(labels, cs.acceptance_rate)
                    tps.add_metric(labels, cs.tokens_per_step)
                if steps is not None:
                    for p in pa.predict(steps, LOADS):
                        speedup.add_metric([model, pa.method, f"{p.load:g}"], p.speedup)
        return [answers, acc, tps, speedup]
