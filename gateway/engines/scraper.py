"""Async scraper of one engine's ``/metrics`` page.

One :class:`MetricsScraper` per engine polls ``GET {base_url}/metrics`` every
``interval_s`` over an injected :class:`aiohttp.ClientSession`, with a timeout, parses
the page (:mod:`gateway.engines.parse`), and keeps a :class:`MetricsWindow` of counter
deltas. The result, a :class:`~gateway.engines.stats.ScrapeState` around the parser's
:class:`~gateway.routing.types.EngineStats`, is readable at any time as
:meth:`MetricsScraper.current`, which marks data older than ``stale_after_s`` (or never
scraped, or unparsable) as stale: stale data is unknown, never zero.

Parsing a 50 KB page takes well under a millisecond after the line filter, so it runs
on the event loop; pages larger than ``thread_parse_bytes`` are parsed in a thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from gateway.engines.parse import MetricsParseError, MetricsSample, MetricsWindow, parse_metrics
from gateway.engines.periodic import PeriodicWorker
from gateway.engines.stats import ScrapeState
from gateway.routing.types import EngineStats

log = logging.getLogger(__name__)

Clock = Callable[[], float]
MAX_PAGE_BYTES = 8 * 1024 * 1024


class MetricsScraper(PeriodicWorker):
    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        model_name: str | None = None,
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        window_s: float = 10.0,
        stale_after_s: float = 5.0,
        clock: Clock = time.monotonic,
        headers: dict[str, str] | None = None,
        thread_parse_bytes: int = 512 * 1024,
        on_update: Callable[[ScrapeState], None] | None = None,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be > 0")
        self._session = session
        self.url = base_url.rstrip("/") + "/metrics"
        self.model_name = model_name
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self._clock = clock
        self._headers = headers or {}
        self._thread_parse_bytes = thread_parse_bytes
        self._on_update = on_update
        self.window = MetricsWindow(window_s=window_s)
        self._stats: EngineStats | None = None
        self._last_success: float | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._scrapes = 0
        self._last_duration: float | None = None
        self._has_spec = False
        self._task: asyncio.Task[None] | None = None

    # -- reading ----------------------------------------------------------------------
    def current(self, now: float | None = None) -> ScrapeState:
        now = self._clock() if now is None else now
        stale = (
            self._last_success is None or self._stats is None or now - self._last_success > self.stale_after_s
        )
        return ScrapeState(
            stats=self._stats,
            stale=stale,
            last_success=self._last_success,
            last_error=self._last_error,
            consecutive_failures=self._failures,
            has_spec_metrics=self._has_spec,
            scrapes=self._scrapes,
            last_duration_s=self._last_duration,
        )

    # -- scraping ---------------------------------------------------------------------
    def ingest(self, text: str, now: float | None = None) -> None:
        """Feed one page (what a scrape does after the HTTP GET). Never raises."""
        now = self._clock() if now is None else now
        try:
            sample = parse_metrics(text, self.model_name)
        except MetricsParseError as exc:
            self._fail(f"parse: {exc}"[:200])
            return
        self._accept(now, sample)

    def _accept(self, now: float, sample: MetricsSample) -> None:
        if not sample.has_vllm_metrics and not sample.has_spec_metrics:
            # A page without vllm:* (e.g. --disable-log-stats): reachable, but no data.
            self._stats = None
            self._fail("no vllm metrics on the page")
            return
        self._has_spec = sample.has_spec_metrics
        self._stats = self.window.add(now, sample)
        self._last_success = now
        self._last_error = None
        self._failures = 0
        self._notify()

    def _fail(self, error: str) -> None:
        self._last_error = error
        self._failures += 1
        self._notify()

    def _notify(self) -> None:
        if self._on_update is not None:
            try:
                self._on_update(self.current())
            except Exception:  # a broken sink must not kill the scraper
                log.exception("scrape update callback failed")

    async def scrape_once(self) -> None:
        """One GET + parse. Never raises (errors are recorded in :meth:`current`)."""
        self._scrapes += 1
        t0 = time.perf_counter()
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with self._session.get(self.url, timeout=timeout, headers=self._headers) as resp:
                if resp.status != 200:
                    self._fail(f"http {resp.status}")
                    return
                body = await resp.content.read(MAX_PAGE_BYTES + 1)
            if len(body) > MAX_PAGE_BYTES:
                self._fail("page too large")
                return
            text = body.decode("utf-8", errors="replace")
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._fail("timeout")
            return
        except (aiohttp.ClientError, OSError) as exc:
            self._fail(f"connect: {type(exc).__name__}")
            return
        now = self._clock()
        try:
            if len(text) > self._thread_parse_bytes:
                sample = await asyncio.to_thread(parse_metrics, text, self.model_name)
            else:
                sample = parse_metrics(text, self.model_name)
        except MetricsParseError as exc:
            self._fail(f"parse: {exc}"[:200])
            return
        self._last_duration = time.perf_counter() - t0
        self._accept(now, sample)

    async def _step(self) -> None:
        await self.scrape_once()

    def _task_name(self) -> str:
        return f"scrape {self.url}"
