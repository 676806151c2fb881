"""How many drafts a speculative step accepts, for methods whose drafts are not text.

For ``ngram`` (and ``suffix``) the engine compares the proposer's draft tokens with the
answer text (see :mod:`specgate_lab.emulator.engine`): a draft token is accepted exactly when
the answer holds it there, and temperature acts through the text (the answer copies less,
and sampling puts other tokens into the copies, :mod:`specgate_lab.emulator.textgen`).

For model-based drafters (``eagle``/``eagle3``, ``mtp``, ``draft_model``, ``medusa``,
``mlp_speculator``) acceptance comes from per-position curves by request kind, taken
from published figures (DESIGN.md section 1): EAGLE-3 on code .50/.40/.33 and on chat
.16/.02/.01; a Qwen3-1.7B draft for Qwen3-32B AL 2.79 at k=3, T=0 falling to 2.61 at
T=1. A curve lists *unconditional* per-position rates (what vLLM's per-position counter
divided by drafts reports); positions past the list continue geometrically.

``rejection_sample_method: synthetic`` replaces all of this with vLLM's synthetic rates
(``synthetic_acceptance_rates``) or a mean acceptance length
(``synthetic_acceptance_length``), as vLLM does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from specgate_lab.emulator.textgen import PromptKind

Curve = tuple[float, ...]

CURVES: dict[str, dict[PromptKind, Curve]] = {
    "eagle3": {
        PromptKind.EDIT: (0.50, 0.40, 0.33, 0.27, 0.22),
        PromptKind.SUMMARY: (0.35, 0.22, 0.14, 0.09, 0.06),
        PromptKind.CHAT: (0.16, 0.02, 0.01, 0.005, 0.002),
    },
    "mtp": {
        PromptKind.EDIT: (0.80, 0.62, 0.48, 0.37, 0.28),
        PromptKind.SUMMARY: (0.70, 0.50, 0.35, 0.24, 0.17),
        PromptKind.CHAT: (0.60, 0.36, 0.21, 0.12, 0.07),
    },
    "draft_model": {
        PromptKind.EDIT: (0.80, 0.68, 0.56, 0.46, 0.38),
        PromptKind.SUMMARY: (0.72, 0.60, 0.47, 0.37, 0.29),
        PromptKind.CHAT: (0.62, 0.45, 0.32, 0.23, 0.16),
    },
    "medusa": {
        PromptKind.EDIT: (0.55, 0.35, 0.22, 0.14, 0.09),
        PromptKind.SUMMARY: (0.45, 0.25, 0.13, 0.07, 0.04),
        PromptKind.CHAT: (0.35, 0.15, 0.06, 0.03, 0.01),
    },
}
CURVES["eagle"] = CURVES["eagle3"]
CURVES["mlp_speculator"] = CURVES["medusa"]

# Per-draft-position decay of the conditional acceptance with temperature: at T=1 a
# draft model keeps ~0.9 of its AL gain (2.79 -> 2.61), heads a little less.
_TEMP_DECAY = {"draft_model": 0.06, "mtp": 0.08, "eagle3": 0.10, "eagle": 0.10, "medusa": 0.12}


def _conditional(rates: Sequence[float], k: int) -> list[float]:
    """Conditional acceptance of position i given i-1 accepted, from unconditional rates."""
    out: list[float] = []
    prev = 1.0
    for i in range(k):
        if i < len(rates):
            r = rates[i]
        else:
            last = rates[-1] if rates else 0.0
            ratio = (rates[-1] / rates[-2]) if len(rates) >= 2 and rates[-2] > 0 else last
            r = last * ratio ** (i - len(rates) + 1)
        out.append(min(1.0, r / prev) if prev > 0 else 0.0)
        prev = max(r, 1e-12)
    return out


def curve_for(method: str, kind: PromptKind, temperature: float, k: int) -> list[float]:
    """Conditional per-position acceptance probabilities for one request."""
    family = CURVES.get(method, CURVES["draft_model"])
    cond = _conditional(family[kind], k)
    decay = 1.0 - _TEMP_DECAY.get(method, 0.08) * min(max(temperature, 0.0), 2.0)
    return [c * decay for c in cond]


def synthetic_curve(rates: Sequence[float] | None, length: float | None, k: int) -> list[float]:
    """Conditional probabilities for vLLM's synthetic rejection sampler."""
    if rates:
        return _conditional(list(rates), k)
    # Mean acceptance length a over k positions with i.i.d. alpha: 1 + sum alpha^i = a.
    target = min(max((length or 1.0) - 1.0, 0.0), float(k))
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < target:
            lo = mid
        else:
            hi = mid
    return [lo] * k


def sample_accepted(cond: Sequence[float], n_drafts: int, rng: random.Random) -> int:
    """Accepted prefix length of ``n_drafts`` drafts under conditional probabilities."""
    a = 0
    while a < n_drafts and a < len(cond) and rng.random() < cond[a]:
        a += 1
    return a
