"""Predicted acceptance of one request, and the online learner that corrects it.

The quantity everything here works in is ``E``: expected output tokens per speculative
engine step for this request. With per-position conditional acceptance α_i (the chance
draft i is accepted given drafts < i were), E = 1 + p_draft · Σ_i Π_{j≤i} α_j, where
``p_draft`` is the chance a step carries drafts at all (1 for model-based drafters; for
n-gram lookup, the chance the suffix matches something in the context).

Priors:
- ``ngram`` (and ``suffix``): drafts are deterministic, so α = p_T(draft token). It rises
  with the predicted prompt→answer overlap and falls with temperature.
- model-based drafters (``eagle``/``eagle3``/``draft_model``/``mtp``/…): a per-position
  curve from published figures, decaying with temperature.

The :class:`KindLearner` keeps, per (kind, temperature bucket), an exponentially
weighted mean of the realised accepted-drafts-per-step (``E - 1``) observed after
responses, and blends it with the prior by evidence count. Memory is bounded: the key
space is |kinds| × |buckets|, and unknown kinds are folded into ``chat``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.physics.methods import NGRAM_METHODS

TEMP_BUCKETS: tuple[float, ...] = (0.05, 0.35, 0.75)  # upper edges; above the last: bucket 3

# Per-position conditional acceptance at T=0, for model-based drafters (EAGLE-3 on code
# ~.50/.40/.33 unconditional → conditional ≈ .50/.80/.83; draft models higher).
MODEL_CURVES: dict[str, tuple[float, ...]] = {
    "eagle3": (0.70, 0.78, 0.80, 0.80, 0.80, 0.80, 0.80, 0.80),
    "eagle": (0.65, 0.72, 0.75, 0.75, 0.75, 0.75, 0.75, 0.75),
    "draft_model": (0.80, 0.81, 0.77, 0.80, 0.80, 0.80, 0.80, 0.80),
    "mtp": (0.80, 0.75, 0.70, 0.70, 0.70, 0.70, 0.70, 0.70),
    "medusa": (0.60, 0.60, 0.55, 0.50, 0.50, 0.50, 0.50, 0.50),
    "mlp_speculator": (0.60, 0.60, 0.55, 0.50, 0.50, 0.50, 0.50, 0.50),
}


def temp_bucket(t: float) -> int:
    for i, edge in enumerate(TEMP_BUCKETS):
        if t <= edge:
            return i
    return len(TEMP_BUCKETS)


def tokens_per_step(alphas: tuple[float, ...] | list[float], p_draft: float = 1.0) -> float:
    """E = 1 + p_draft · Σ_i Π_{j≤i} α_j."""
    acc, prod = 0.0, 1.0
    for a in alphas:
        prod *= min(max(a, 0.0), 1.0)
        acc += prod
    return 1.0 + min(max(p_draft, 0.0), 1.0) * acc


def ngram_prior(overlap: float, temperature: float, k: int) -> tuple[float, float]:
    """(E, p_draft) for prompt lookup with ``k`` drafts, from overlap and temperature.

    p_draft: a step drafts only when the last n tokens (vLLM: ``prompt_lookup_min``..
    ``max``, 5 by default) occurred before, so even copy-heavy answers draft on a
    minority of steps: the published n-gram example (AL 3.63 on drafted steps, 1.95 over
    all tokens) drafts on ~36 % of them; open chat almost never. α: a deterministic draft
    token is accepted with the target's probability of it, high inside a copied span and
    falling with temperature (α = p_T(draft)).
    """
    ov = min(max(overlap, 0.0), 1.0)
    p_draft = min(1.0, 0.02 + 0.35 * ov)
    alpha = 0.9 * math.exp(-0.4 * min(max(temperature, 0.0), 2.0))
    return tokens_per_step([alpha] * k, p_draft), p_draft


def model_prior(method: str, temperature: float, k: int) -> float:
    """E for a model-based drafter; acceptance decays with temperature (AL 2.79 → 2.61 at T=1)."""
    curve = MODEL_CURVES.get(method, MODEL_CURVES["eagle"])
    decay = 1.0 - 0.12 * min(temperature, 1.5)
    alphas = [curve[min(i, len(curve) - 1)] * decay for i in range(k)]
    return tokens_per_step(alphas)


def prior_tokens_per_step(method: str | None, overlap: float, temperature: float, k: int) -> float:
    if k <= 0:
        return 1.0
    m = (method or "ngram").lower()
    if m in NGRAM_METHODS:
        return ngram_prior(overlap, temperature, k)[0]
    return model_prior(m, temperature, k)


@dataclass
class _Ewma:
    value: float = 0.0
    weight: float = 0.0  # effective number of observations (decays)
    updated: float = 0.0

    def add(self, x: float, now: float, half_life: float, max_weight: float) -> None:
        if self.weight > 0 and half_life > 0:
            self.weight *= 0.5 ** (max(0.0, now - self.updated) / half_life)
        w = min(self.weight, max_weight)
        self.value = (self.value * w + x) / (w + 1.0)
        self.weight = w + 1.0
        self.updated = now

    def evidence(self, now: float, half_life: float) -> float:
        if self.weight <= 0 or half_life <= 0:
            return self.weight
        return float(self.weight * 0.5 ** (max(0.0, now - self.updated) / half_life))


class KindLearner:
    """Per (kind, temperature bucket) learned accepted-drafts-per-step (E − 1)."""

    def __init__(
        self,
        kinds: tuple[str, ...],
        *,
        prior_weight: float = 3.0,
        half_life_s: float = 300.0,
        max_weight: float = 50.0,
    ) -> None:
        self.kinds = kinds
        self.prior_weight = prior_weight
        self.half_life_s = half_life_s
        self.max_weight = max_weight
        self._est: dict[tuple[str, int], _Ewma] = {}
        self.version = 0  # changes with every observation (for callers that memoise)

    def key(self, kind: str, temperature: float) -> tuple[str, int]:
        """The class a request falls in: (kind, temperature bucket)."""
        return (kind if kind in self.kinds else "chat", temp_bucket(temperature))

    def observe(self, kind: str, temperature: float, accepted_per_step: float, now: float) -> None:
        if not math.isfinite(accepted_per_step):
            return
        est = self._est.setdefault(self.key(kind, temperature), _Ewma())
        est.add(max(0.0, accepted_per_step), now, self.half_life_s, self.max_weight)
        self.version += 1

    def learned(self, key: tuple[str, int], now: float) -> tuple[float, float]:
        """(evidence weight of the learned part 0..1, learned E) for a class (:meth:`key`);
        E = (1 - w) · prior + w · learned."""
        est = self._est.get(key)
        if est is None:
            return 0.0, 1.0
        n = est.evidence(now, self.half_life_s)
        return n / (n + self.prior_weight), 1.0 + est.value

    def blend(self, kind: str, temperature: float, prior_e: float, now: float) -> tuple[float, float]:
        """(E blended with what was learned, evidence weight of the learned part 0..1)."""
        w, learned = self.learned(self.key(kind, temperature), now)
        return (1.0 - w) * prior_e + w * learned, w

    def snapshot(self, now: float) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (kind, b), est in sorted(self._est.items()):
            out[f"{kind}/t{b}"] = {
                "tokens_per_step": round(1.0 + est.value, 4),
                "evidence": round(est.evidence(now, self.half_life_s), 2),
            }
        return out
