"""What one HTTP/2 peer may cost the EPP: frame-rate budgets and memory bounds.

Kept apart from the framing (:mod:`gateway.envoy.h2`) so that the same policy could sit over
another HTTP/2 stack: the framing reports each frame of a budgeted kind (:meth:`Budgets.charge`)
and each byte it holds for a peer (:class:`MemoryPool`), and ends the connection with GOAWAY
ENHANCE_YOUR_CALM when a budget is crossed (:class:`Calm`).

Budgets are token buckets per connection: ``rate`` frames a second, ``burst`` at once.
A frame that a busy, well-behaved peer sends in proportion to its streams (a RST_STREAM on a
stream the server already ended, a WINDOW_UPDATE) is paid for by the stream it belongs to:
each stream the peer opens credits those budgets (:data:`PER_STREAM`), so they bound what a
peer sends beyond its work, not its request rate (Envoy at thousands of requests a second
resets ended ext_proc streams at the same rate). A budget is crossed only by a peer that
floods (rapid reset, PING/SETTINGS floods, CONTINUATION trains, WINDOW_UPDATE storms, empty
frames), and the connection ends on the frame that crosses it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# budget classes
PING_B, SETTINGS_B, RESET_B, CONTINUATION_B, WINDOW_B, EMPTY_B, STREAMS_B, OTHER_B = range(8)
NAMES = (
    "PING",
    "SETTINGS",
    "early RST_STREAM",
    "CONTINUATION",
    "WINDOW_UPDATE",
    "empty",
    "new stream",
    "ignored",
)


# What one opened stream credits: its own closing RST_STREAM after the server ended it
# (counted as ``ignored``: the stream is gone) and the WINDOW_UPDATEs its data causes.
PER_STREAM = ((OTHER_B, 1.0), (WINDOW_B, 2.0))


class Calm(Exception):
    """A peer crossed a budget: end its connection with GOAWAY ENHANCE_YOUR_CALM."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection frame budgets (``(rate per second, burst)``) and memory bounds (bytes)."""

    ping: tuple[float, float] = (10.0, 100.0)
    settings: tuple[float, float] = (10.0, 100.0)
    early_reset: tuple[float, float] = (200.0, 400.0)
    continuation: tuple[float, float] = (100.0, 200.0)
    window_update: tuple[float, float] = (1000.0, 2000.0)
    empty: tuple[float, float] = (100.0, 500.0)
    streams: tuple[float, float] = (20_000.0, 5000.0)
    other: tuple[float, float] = (100.0, 500.0)
    stream_memory: int = 10 << 20  # a stream's partial message, held body, queued output
    connection_memory: int = 32 << 20  # the same, summed over a connection's streams
    connection_window: int = 16 << 20  # the receive window granted to the connection
    stream_window: int = 1 << 20  # the initial receive window of each stream
    write_buffer: int = 1 << 20  # queued in the socket's buffer: reading pauses above
    slice_s: float = 0.00025  # how long the EPP's frames may hold the event loop in one turn
    overdrawn_share: float = 0.1  # the loop's time for connections that had streams ended for memory

    def rates(self) -> tuple[tuple[float, float], ...]:
        return (
            self.ping,
            self.settings,
            self.early_reset,
            self.continuation,
            self.window_update,
            self.empty,
            self.streams,
            self.other,
        )


class Budgets:
    """The token buckets of one connection."""

    __slots__ = ("_burst", "_last", "_rate", "_tokens", "crossed")

    def __init__(self, limits: Limits) -> None:
        rates = limits.rates()
        self._rate = [r for r, _ in rates]
        self._burst = [b for _, b in rates]
        self._tokens = list(self._burst)
        now = time.monotonic()
        self._last = [now] * len(rates)
        self.crossed: str | None = None  # the budget that ended the connection

    def charge(self, kind: int, now: float) -> None:
        """One frame of ``kind`` at ``now``; raises :class:`Calm` past the budget."""
        tokens = self._tokens[kind] + (now - self._last[kind]) * self._rate[kind]
        burst = self._burst[kind]
        self._last[kind] = now
        if tokens > burst:
            tokens = burst
        tokens -= 1.0
        self._tokens[kind] = tokens
        if tokens < 0.0:
            self.crossed = NAMES[kind]
            raise Calm(f"{NAMES[kind]} frames over {self._rate[kind]:g}/s (burst {burst:g})")

    def credit_stream(self) -> None:
        """A stream was opened: the frames it may cause later are paid (:data:`PER_STREAM`),
        up to the budget's burst."""
        for kind, n in PER_STREAM:
            self._tokens[kind] = min(self._tokens[kind] + n, self._burst[kind])


class MemoryPool:
    """Bytes the EPP holds for all its peers (partial messages, held bodies, queued output),
    bounded process-wide: a stream that would take it past ``limit`` is ended instead."""

    __slots__ = ("limit", "peak", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        if self.used > self.peak:
            self.peak = self.used
        return True

    def give(self, n: int) -> None:
        self.used = max(0, self.used - n)


UNBOUNDED = MemoryPool(1 << 62)


class Turn:
    """The EPP's share of one turn of the event loop, over all its connections.

    Each connection handles its frames in slices; without a shared bound, N connections with
    bytes waiting would each take a slice in the same turn, and N attacking connections would
    hold the loop N slices at a time (16 connections pushing data put the gateway's chat p99 at
    100-150 ms on a 16-core host). Here every connection spends from one budget of ``budget_s``
    a turn: a connection that finds it spent waits in line (:meth:`wait`), and at the next turn
    the line resumes in order, round-robin, until the budget is spent again. The rest of the
    loop's work (the HTTP gateway, health checks) runs between turns.

    With ``share`` below 1, while connections wait in line the next turn comes no sooner than
    the loop's other work had ``(1 - share) / share`` of the time the last one took: the line
    gets at most ``share`` of the loop. The server keeps such a line for peers it has had to
    end streams of for memory (:meth:`H2Connection.overdrawn`): a peer that keeps announcing
    more than the EPP will hold gets that share, not a slice of every turn."""

    __slots__ = ("_line", "_rest", "_resume_at", "_scheduled", "budget_s", "spent")

    def __init__(self, budget_s: float, share: float = 1.0) -> None:
        if not 0.0 < share <= 1.0:
            raise ValueError("share must be in (0, 1]")
        self.budget_s = budget_s
        self.spent = 0.0
        self._rest = (1.0 - share) / share  # the loop's other time per second of EPP frames
        self._resume_at = 0.0  # the line's next turn, no sooner (time.monotonic())
        self._line: deque[Callable[[], None]] = deque()
        self._scheduled = False

    def left(self) -> float:
        """What this turn's budget still holds (seconds; ≤ 0 when spent)."""
        return self.budget_s - self.spent

    def exhausted(self) -> bool:
        """Spent by a connection this turn (the first to ask in a turn always gets its slice,
        so every turn makes progress whatever the budget)."""
        return self.spent > 0.0 and self.spent >= self.budget_s

    def charge(self, seconds: float) -> None:
        """A connection spent ``seconds`` of this turn."""
        self.spent += seconds
        if self._line and self._rest:
            self._resume_at = time.monotonic() + self.spent * self._rest
        self._schedule()

    def wait(self, resume: Callable[[], None]) -> None:
        """``resume`` once a later turn has budget for it (in the order connections asked)."""
        self._line.append(resume)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next)

    def _next(self) -> None:
        line = self._line
        if line and self._rest:  # a backlog: the loop's other work first, for its share
            early = self._resume_at - time.monotonic()
            if early > 0.0:
                asyncio.get_running_loop().call_later(early, self._next)
                return
        self._scheduled = False
        self.spent = 0.0
        while line and not self.exhausted():
            line.popleft()()
        if line:
            if self._rest:
                self._resume_at = time.monotonic() + self.spent * self._rest
            self._schedule()
