"""What the scraper knows about one engine: the latest stats record and how the scrapes go.

The stats themselves are one :class:`~gateway.routing.types.EngineStats` record, made by
the parser (:mod:`gateway.engines.parse`); this module only wraps it in the scrape's
status. No I/O here: the runtime keeps the latest :class:`ScrapeState` it was sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.types import UNKNOWN_STATS, EngineStats


@dataclass(frozen=True, slots=True)
class ScrapeState:
    """What the router may use of one engine's scraped metrics right now."""

    stats: EngineStats | None = None  # None: no usable page yet, or the last one had no vllm:*
    stale: bool = True  # as the scraper judged it when it made this state
    last_success: float | None = None  # monotonic time of the last successful scrape
    last_error: str | None = None  # why the last scrape failed, when it did
    consecutive_failures: int = 0
    has_spec_metrics: bool = False
    scrapes: int = 0
    # Wall seconds the last successful scrape took (GET + parse), for telemetry.
    last_duration_s: float | None = None

    @property
    def ok(self) -> bool:
        """There is a record from a successful scrape (how old it is, is the reader's call)."""
        return self.stats is not None and self.last_success is not None

    @property
    def scraped_at(self) -> float:
        return self.last_success if self.last_success is not None else 0.0

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, for ``GET /admin/state``: the scrape's status, then the record."""
        return {
            "scraped_at": self.scraped_at,
            "ok": self.ok,
            "error": self.last_error,
            **(self.stats or UNKNOWN_STATS).as_dict(),
        }
