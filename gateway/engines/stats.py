"""What the scraper knows about one engine, as the runtime stores it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineStats:
    """One engine's scraped state. ``None`` fields are unknown (never read them as zero)."""

    scraped_at: float  # monotonic time of the scrape these values come from
    ok: bool = True  # the last scrape succeeded
    error: str | None = None  # why the last scrape failed, when it did
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position: tuple[float, ...] | None = None
    tpot_s: float | None = None
    step_s: float | None = None  # windowed mean inter-token latency (one step as requests see it)
    tokens_per_step: float | None = None  # spec engines: Δgeneration / (Δgeneration − Δaccepted)

    def as_dict(self) -> dict[str, object]:
        return {
            "scraped_at": self.scraped_at,
            "ok": self.ok,
            "error": self.error,
            "running": self.running,
            "waiting": self.waiting,
            "kv_usage": self.kv_usage,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position": list(self.per_position) if self.per_position is not None else None,
            "tpot_s": self.tpot_s,
            "step_s": self.step_s,
            "tokens_per_step": self.tokens_per_step,
        }
