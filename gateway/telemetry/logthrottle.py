"""Rate-limited logging: at most one line per key per interval, counting what was held back.

A failing engine under load, or a flood of malformed requests, must not turn into one
line per request: the first line of a key is logged at once, later ones within
``interval_s`` are counted, and the count comes out either on the next line of that key
that gets through (``(N similar suppressed in the last Xs)``) or, when the key has gone
quiet, from :meth:`LogThrottle.flush` (called periodically). Either way a key costs at
most one line per interval. Memory is bounded: beyond ``max_keys`` keys, new keys share
one overflow key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

OVERFLOW_KEY = "\x00overflow"


@dataclass(slots=True)
class _Slot:
    last: float  # when a line (record or summary) of this key was last written
    held: int = 0  # suppressed since then
    label: str = ""  # what the summary names (safe text given by the caller)


@dataclass(frozen=True, slots=True)
class Summary:
    key: str
    label: str
    held: int
    span_s: float

    def message(self) -> str:
        return f"{self.held} similar messages suppressed in the last {self.span_s:.0f}s: {self.label}"


class LogThrottle:
    def __init__(
        self, interval_s: float = 5.0, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 1024
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._slots: dict[str, _Slot] = {}

    @property
    def _last(self) -> dict[str, float]:  # kept for tests and introspection
        return {k: s.last for k, s in self._slots.items()}

    def admit(self, key: str, label: str = "") -> tuple[bool, int, float]:
        """Whether a line of ``key`` may be written now; with it, how many were held back
        since the previous line of the key and over how many seconds."""
        now = self._clock()
        slot = self._slots.get(key)
        if slot is None:
            full = self._max_keys - 1  # one slot stays free for the overflow key
            if len(self._slots) >= full:
                self._prune(now)
            if len(self._slots) >= full:
                key = OVERFLOW_KEY
                slot = self._slots.get(key)
        if slot is None:
            self._slots[key] = _Slot(now, 0, label)
            return True, 0, 0.0
        if now - slot.last < self.interval_s:
            slot.held += 1
            slot.label = slot.label or label
            return False, 0, 0.0
        held, span = slot.held, now - slot.last
        slot.last, slot.held = now, 0
        return True, held, span

    def flush(self, *, final: bool = False) -> list[Summary]:
        """Summaries of the keys whose interval is over with lines held back (``final``:
        of every key with lines held back); each counts as that key's line for the next
        interval."""
        now = self._clock()
        out: list[Summary] = []
        for key, slot in self._slots.items():
            if slot.held and (final or now - slot.last >= self.interval_s):
                out.append(Summary(key, slot.label or key, slot.held, now - slot.last))
                slot.last, slot.held = now, 0
        return out

    def _prune(self, now: float) -> None:
        stale = [k for k, s in self._slots.items() if not s.held and now - s.last >= self.interval_s]
        for k in stale:
            del self._slots[k]

    def log(
        self,
        logger: logging.Logger,
        level: int,
        key: str,
        msg: str,
        *args: object,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Log ``msg % args`` unless ``key`` was logged less than ``interval_s`` ago. True if logged."""
        if not logger.isEnabledFor(level):
            return False
        ok, held, span = self.admit(key, msg)
        if not ok:
            return False
        if held:
            msg += " (%d similar suppressed in the last %.0fs)"
            args = (*args, held, span)
        logger.log(level, msg, *args, extra=dict(extra) if extra else None)
        return True
