"""Active health checks: ``GET {base_url}/health`` every ``interval_s``, with a timeout.

An engine is marked down after ``failures_to_down`` consecutive failures and up again
after ``successes_to_up`` consecutive successes (a little hysteresis, so one slow reply
does not take an engine out). State changes are reported through ``on_change``, which
the gateway wires to the engine runtime's health flag.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from gateway.engines.periodic import PeriodicWorker

log = logging.getLogger(__name__)


class HealthChecker(PeriodicWorker):
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        failures_to_down: int = 2,
        successes_to_up: int = 1,
        initially_healthy: bool = True,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures_to_down < 1 or successes_to_up < 1:
            raise ValueError("thresholds must be >= 1")
        self._session = session
        self.url = base_url.rstrip("/") + "/health"
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures_to_down = failures_to_down
        self.successes_to_up = successes_to_up
        self.healthy = initially_healthy
        self.last_error: str | None = None
        self.last_check: float | None = None
        self._fails = 0
        self._oks = 0
        self._on_change = on_change
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def record(self, ok: bool, error: str | None = None) -> None:
        """Apply one check result (what :meth:`check_once` does after the GET)."""
        self.last_check = self._clock()
        if ok:
            self._oks += 1
            self._fails = 0
            self.last_error = None
            if not self.healthy and self._oks >= self.successes_to_up:
                self._set(True)
        else:
            self._fails += 1
            self._oks = 0
            self.last_error = error
            if self.healthy and self._fails >= self.failures_to_down:
                self._set(False)

    def _set(self, healthy: bool) -> None:
        self.healthy = healthy
        log.info("engine %s is now %s", self.url, "up" if healthy else "down")
        if self._on_change is not None:
            try:
                self._on_change(healthy)
            except Exception:
                log.exception("health change callback failed")

    async def check_once(self) -> bool:
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self._session.get(self.url, timeout=timeout) as resp:
                await resp.read()
                ok = resp.status == 200
                self.record(ok, None if ok else f"http {resp.status}")
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self.record(False, "timeout")
        except (aiohttp.ClientError, OSError) as exc:
            self.record(False, f"connect: {type(exc).__name__}")
        return self.healthy

    async def _step(self) -> None:
        await self.check_once()

    def _task_name(self) -> str:
        return f"health {self.url}"
