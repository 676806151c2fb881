"""Bounded label values: no request ids, no free text, a cap on distinct values."""

from __future__ import annotations

import re

OTHER = "other"
_SAFE = re.compile(r"[^A-Za-z0-9_.:/@+-]")
_MAX_LEN = 64


def clean(value: object) -> str:
    """A printable, short label value (characters outside a safe set become ``_``)."""
    s = str(value)
    if len(s) > _MAX_LEN:
        s = s[:_MAX_LEN]
    return _SAFE.sub("_", s) or "none"


class LabelGuard:
    """Maps values to themselves until ``limit`` distinct values were seen, then to ``other``.

    With ``allowed`` set, only those values pass (plus ``extra``, e.g. ``none``).
    """

    __slots__ = ("_allowed", "_limit", "_memo", "_seen")

    def __init__(self, limit: int, allowed: tuple[str, ...] | None = None) -> None:
        self._limit = limit
        self._allowed = frozenset(allowed) if allowed is not None else None
        self._seen: set[str] = set()
        self._memo: dict[object, str] = {}  # raw value -> label, for the values seen most

    def __call__(self, value: object) -> str:
        hit = self._memo.get(value)
        if hit is not None:
            return hit
        label = self._map(value)
        if len(self._memo) < 4 * self._limit + 16:
            self._memo[value] = label
        return label

    def _map(self, value: object) -> str:
        s = clean(value)
        if self._allowed is not None:
            return s if s in self._allowed or s == "none" else OTHER
        if s in self._seen:
            return s
        if len(self._seen) < self._limit:
            self._seen.add(s)
            return s
        return OTHER

    def forget(self, value: object) -> None:
        """``value`` is no longer in use (an engine that left): its place is free again."""
        label = self._memo.pop(value, None)
        if label is None:
            label = clean(value)
        if label != OTHER and label in self._seen:
            self._seen.discard(label)
            # values refused for want of room may pass now
            self._memo = {k: v for k, v in self._memo.items() if v != OTHER}
