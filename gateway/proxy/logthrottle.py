"""Rate-limited logging: at most one line per key per interval, counting what was held back.

A failing engine under load must not turn into one warning per request: the first
failure is logged at once, later ones of the same key within ``interval_s`` are counted,
and the next line that gets through says how many were suppressed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any


class LogThrottle:
    def __init__(
        self, interval_s: float = 5.0, *, clock: Callable[[], float] = time.monotonic, max_keys: int = 1024
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._max_keys = max_keys
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

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
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        if len(self._last) >= self._max_keys and key not in self._last:
            self._last.clear()  # bounded memory: forget old keys (worst case: one extra line each)
            self._held.clear()
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held:
            msg += " (%d similar suppressed in the last %.0fs)"
            args = (*args, held, now - last if last is not None else 0.0)
        logger.log(level, msg, *args, extra=dict(extra) if extra else None)
        return True
