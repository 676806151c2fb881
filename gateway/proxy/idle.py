"""A stream's idle and total time limits, kept without a timer per chunk."""

from __future__ import annotations

import asyncio


class IdleTimer:
    """The idle/total limit of a stream without a timer per chunk: ``touch`` moves the
    expiry forward (a float store); the one armed timer, when it fires early, re-arms
    itself for the new expiry, and only a real expiry fires the ``asyncio.timeout``
    (rescheduled to now, so cancellation and TimeoutError keep asyncio's semantics)."""

    __slots__ = ("_deadline", "_handle", "_idle_s", "_loop", "_tm", "expires", "waiting_client")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float, deadline: float) -> None:
        self._loop = loop
        self._idle_s = idle_s
        self._deadline = deadline
        self._tm: asyncio.Timeout | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.expires = deadline
        self.waiting_client = False  # the limit running is the client's (a write), not the engine's

    def touch(self, tm: asyncio.Timeout) -> None:
        """Waiting for the engine: its idle limit (within the request's total)."""
        self.waiting_client = False
        self._arm(tm, min(self._deadline, self._loop.time() + self._idle_s))

    def client(self, tm: asyncio.Timeout, stall_s: float) -> None:
        """Waiting for the client to take a write: its own stall limit (the total does not
        apply here: it would blame whoever is read next)."""
        self.waiting_client = True
        self._arm(tm, self._loop.time() + stall_s)

    def _arm(self, tm: asyncio.Timeout, expires: float) -> None:
        self.expires = expires
        if self._handle is not None and self._handle.when() > expires:
            self._handle.cancel()
            self._handle = None
        if self._handle is None:
            self._tm = tm
            self._handle = self._loop.call_at(self.expires, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        if now < self.expires:
            self._handle = self._loop.call_at(self.expires, self._check)
        elif self._tm is not None and self._tm.expired() is False:
            self._handle = None
            self._tm.reschedule(now)  # fires the timeout on the next loop iteration

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._tm = None
