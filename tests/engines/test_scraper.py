from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.engines.health import HealthChecker
from gateway.engines.scraper import MetricsScraper, ScrapeState
from tests.fakes import FakeClock


class Upstream:
    def __init__(self, page: str) -> None:
        self.page = page
        self.status = 200
        self.health_status = 200

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, status=self.status)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)


@pytest.fixture
async def served(spec_page: str) -> AsyncIterator[tuple[Upstream, str, aiohttp.ClientSession]]:
    up = Upstream(spec_page)
    server = TestServer(up.app(), host="127.0.0.1", port=0)
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield up, str(server.make_url("")), session
    await server.close()


async def test_scrape_real_page_and_staleness(served: tuple[Upstream, str, aiohttp.ClientSession]) -> None:
    _up, url, session = served
    clock = FakeClock(100.0)
    seen: list[ScrapeState] = []
    sc = MetricsScraper(session, url, clock=clock, stale_after_s=5.0, on_update=seen.append)
    assert sc.current().stale  # never scraped: unknown
    assert sc.current().last_duration_s is None
    await sc.scrape_once()
    st = sc.current()
    assert not st.stale and st.has_spec_metrics and st.stats is not None
    assert st.last_duration_s is not None and st.last_duration_s > 0
    assert st.stats.running == 0.0 and seen
    clock.t += 6.0
    assert sc.current().stale  # old data is unknown, never zero


async def test_garbage_and_http_errors_are_recorded(
    served: tuple[Upstream, str, aiohttp.ClientSession],
) -> None:
    up, url, session = served
    clock = FakeClock(100.0)
    sc = MetricsScraper(session, url, clock=clock)
    await sc.scrape_once()
    up.page = "vllm:num_requests_running{engine= garbage\n"
    await sc.scrape_once()  # must not raise
    st = sc.current()
    assert st.last_error is not None and st.last_error.startswith("parse")
    assert st.consecutive_failures == 1
    up.status = 500
    await sc.scrape_once()
    assert sc.current().last_error == "http 500" and sc.current().consecutive_failures == 2
    up.page, up.status = "python_info 1.0\n", 200
    await sc.scrape_once()
    assert sc.current().last_error == "no vllm metrics on the page"
    assert sc.current().stats is None


async def test_connection_refused_is_recorded() -> None:
    async with aiohttp.ClientSession() as session:
        server = TestServer(web.Application(), host="127.0.0.1", port=0)
        await server.start_server()
        url = str(server.make_url(""))
        await server.close()  # nothing listens there now
        sc = MetricsScraper(session, url, timeout_s=1.0)
        await sc.scrape_once()
        st = sc.current()
        assert st.stale and st.last_error is not None and st.last_error.startswith("connect")


async def test_health_checker_hysteresis(served: tuple[Upstream, str, aiohttp.ClientSession]) -> None:
    up, url, session = served
    changes: list[bool] = []
    hc = HealthChecker(session, url, failures_to_down=2, on_change=changes.append)
    assert await hc.check_once()
    up.health_status = 503
    assert await hc.check_once()  # one failure is not enough
    assert not await hc.check_once()
    assert changes == [False] and hc.last_error == "http 503"
    up.health_status = 200
    assert await hc.check_once()
    assert changes == [False, True]
