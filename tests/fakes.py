"""Test doubles shared across the suite."""

from __future__ import annotations


class FakeClock:
    """A clock the test moves by hand: ``clock()`` reads it; ``advance(dt)`` or ``clock.t = x`` sets it."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt
