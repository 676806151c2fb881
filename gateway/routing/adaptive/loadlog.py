"""The pair's load at each decision, kept for as long as a request may live: whether a
finished request's measured time per token is evidence about the model, or about a load
that changed under it (the filter of what the latency bias learns, :mod:`.calibration`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gateway.routing.adaptive.knobs import knob
from gateway.routing.types import Outcome, Route


@dataclass(frozen=True, slots=True)
class LoadLogKnobs:
    drift: float = knob(
        0.25,
        "share of the load found",
        "a load that moved more than this under a request measured the change",
    )
    drift_floor: float = knob(
        8.0, "requests", "on a light pair a couple of requests more or less is not a change of load"
    )
    horizon_s: float = knob(300.0, "s", "longer requests are not judged (they would keep minutes of history)")
    max_entries: int = knob(8192, "decisions", "bounds the memory at a few thousand requests per second")


class LoadEntry(NamedTuple):
    at: float
    load: float  # the batch the pair's load makes
    log_spec: float  # log of the live corrections the model applied to spec at that load
    log_base: float  # ...and to plain


Lens = Callable[[float], tuple[float, float]]


class LoadLog:
    """(time, load, live corrections) at each decision, for ``horizon_s``."""

    def __init__(self, knobs: LoadLogKnobs | None = None) -> None:
        self.knobs = knobs or LoadLogKnobs()
        self.entries: deque[LoadEntry] = deque(maxlen=self.knobs.max_entries)

    def record(self, now: float, load: float, lens: tuple[float, float]) -> None:
        self.entries.append(LoadEntry(now, load, *lens))
        while self.entries and self.entries[0].at < now - self.knobs.horizon_s:
            self.entries.popleft()

    def held(self, outcome: Outcome, now: float, lens: Lens) -> tuple[float, float] | None:
        """The load (batch) the request found and the log of the live corrections its
        prediction was priced with (for its engine), if the pair's load held while it ran
        (else None): its prediction was made at the load it found, and a request that met a
        rising (or falling) load measured that change, not the model's error (a cold start
        at high QPS fills the engine within the first requests' lives)."""
        if outcome.tpot_s is None or outcome.probe:
            return None
        start = now - (outcome.ttft_s or 0.0) - outcome.tpot_s * max(0, outcome.completion_tokens - 1)
        spec = outcome.route is Route.SPEC
        life: list[LoadEntry] = []
        for entry in reversed(self.entries):  # newest first, back to the request's start
            if entry.at < start:
                break
            life.append(entry)
        if not life:  # no other request arrived meanwhile: the load it found held
            if not self.entries:
                idle = lens(1.0)
                return 1.0, idle[0] if spec else idle[1]
            last = self.entries[-1]
            return last.load, last.log_spec if spec else last.log_base
        first = life[-1]
        found, mean = first.load, sum(e.load for e in life) / len(life)
        if abs(mean - found) > self.knobs.drift * max(found, self.knobs.drift_floor):
            return None
        return found, first.log_spec if spec else first.log_base
