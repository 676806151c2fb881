"""Value types of the workload corpus: a request, a temperature distribution, a kind mix."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Top-level request kinds, in the order the default mix lists them.
KINDS: tuple[str, ...] = ("edit", "summary", "rag", "chat")

# Sub-kinds per kind. ``edit``: copy-heavy code edits; ``summary``: work over one pasted
# document; ``rag``: a question over retrieved passages; ``chat``: open questions.
SUBKINDS: dict[str, tuple[str, ...]] = {
    "edit": ("rename", "typehints", "docstrings", "constant"),
    "summary": ("summarize", "extract", "quote"),
    "rag": ("rag",),
    "chat": ("chat",),
}

# Nominal fraction of a good answer that copies the prompt, per sub-kind. A label for
# tests, plots and the emulator's defaults: the realised overlap is measured from text.
NOMINAL_OVERLAP: dict[str, float] = {
    "rename": 0.95,
    "typehints": 0.85,
    "docstrings": 0.8,
    "constant": 0.9,
    "summarize": 0.3,
    "extract": 0.65,
    "quote": 0.9,
    "rag": 0.5,
    "chat": 0.05,
}

DEFAULT_MIX: dict[str, float] = {"edit": 0.4, "summary": 0.2, "rag": 0.1, "chat": 0.3}


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One chat request of the corpus.

    ``reference`` is a correct answer where one can be computed (code edits, quoting,
    extraction, RAG facts); ``None`` for free-form tasks. It lets tests and the emulator
    measure how much of an ideal answer copies the prompt.
    """

    kind: str
    subkind: str
    messages: tuple[dict[str, str], ...]
    temperature: float
    max_tokens: int
    reference: str | None = None
    seed: int = 0
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def nominal_overlap(self) -> float:
        return NOMINAL_OVERLAP.get(self.subkind, 0.0)

    @property
    def prompt_text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


class TemperatureDist:
    """A distribution of sampling temperatures, parsed from a short spec string.

    Specs: ``0.7`` (constant), ``uniform:0:1``, ``choice:0,0.3,0.7,1`` (equal weights),
    ``mix:0=0.5,0.7=0.3,1.0=0.2`` (weighted), ``default`` (= ``mix:0=0.4,0.3=0.2,0.7=0.2,1.0=0.2``).
    """

    def __init__(self, values: tuple[float, ...], weights: tuple[float, ...] | None, uniform: bool) -> None:
        self.values = values
        self.weights = weights
        self.uniform = uniform

    @classmethod
    def constant(cls, t: float) -> TemperatureDist:
        return cls((_check_t(t),), None, False)

    @classmethod
    def parse(cls, spec: str | float | TemperatureDist) -> TemperatureDist:
        if isinstance(spec, TemperatureDist):
            return spec
        if isinstance(spec, int | float):
            return cls.constant(float(spec))
        s = spec.strip().lower()
        if s in ("", "default"):
            s = "mix:0=0.4,0.3=0.2,0.7=0.2,1.0=0.2"
        try:
            if s.startswith("uniform:"):
                _, lo, hi = s.split(":")
                a, b = _check_t(float(lo)), _check_t(float(hi))
                if a > b:
                    raise ValueError("low above high")
                return cls((a, b), None, True)
            if s.startswith("choice:"):
                vals = tuple(_check_t(float(v)) for v in s[len("choice:") :].split(",") if v.strip())
                if not vals:
                    raise ValueError("no values")
                return cls(vals, None, False)
            if s.startswith("mix:"):
                pairs = [p.split("=") for p in s[len("mix:") :].split(",") if p.strip()]
                vals = tuple(_check_t(float(v)) for v, _ in pairs)
                ws = tuple(float(w) for _, w in pairs)
                if not vals or any(w < 0 for w in ws) or sum(ws) <= 0:
                    raise ValueError("weights must be >= 0 with a positive sum")
                return cls(vals, ws, False)
            return cls.constant(float(s))
        except ValueError as exc:
            raise ValueError(f"bad temperature spec {spec!r}: {exc}") from None

    def sample(self, rng: random.Random) -> float:
        if self.uniform:
            return round(rng.uniform(self.values[0], self.values[1]), 3)
        if len(self.values) == 1:
            return self.values[0]
        if self.weights is None:
            return rng.choice(self.values)
        return rng.choices(self.values, weights=self.weights, k=1)[0]

    def __repr__(self) -> str:
        if self.uniform:
            return f"TemperatureDist(uniform {self.values[0]}..{self.values[1]})"
        return f"TemperatureDist(values={self.values}, weights={self.weights})"


def _check_t(t: float) -> float:
    if not 0.0 <= t <= 2.0:
        raise ValueError(f"temperature {t} outside 0..2")
    return t


def parse_mix(spec: str | Mapping[str, float] | None) -> dict[str, float]:
    """Parse ``edit=0.4,summary=0.2,rag=0.1,chat=0.3`` (or a mapping) into normalised weights.

    A sub-kind name (``rename``, ``quote``, …) is accepted too and selects only that sub-kind.
    """
    if spec is None or spec == "" or spec == "default":
        raw: dict[str, float] = dict(DEFAULT_MIX)
    elif isinstance(spec, str):
        raw = {}
        for part in spec.split(","):
            if not part.strip():
                continue
            name, sep, weight = part.partition("=")
            try:
                raw[name.strip()] = float(weight) if sep else 1.0
            except ValueError:
                raise ValueError(f"bad mix entry {part!r}: weight must be a number") from None
    else:
        raw = {str(k): float(v) for k, v in spec.items()}
    known = set(KINDS) | {s for subs in SUBKINDS.values() for s in subs}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown workload kinds {unknown}; known: {sorted(known)}")
    if any(w < 0 for w in raw.values()) or sum(raw.values()) <= 0:
        raise ValueError("mix weights must be >= 0 with a positive sum")
    total = sum(raw.values())
    return {k: w / total for k, w in raw.items() if w > 0}


def kind_of(name: str) -> str:
    """Top-level kind of a kind or sub-kind name."""
    if name in SUBKINDS:
        return name
    for kind, subs in SUBKINDS.items():
        if name in subs:
            return kind
    raise ValueError(f"unknown workload kind {name!r}")
