"""`specgate demo` routes its sample requests through the gateway in front of the emulated pair."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from gateway.telemetry.logs import ACCESS_LOGGER
from specgate_lab.demo import SAMPLES, run_demo

pytestmark = pytest.mark.timeout(60)


async def test_demo_routes_samples_through_the_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    results = await run_demo(port=0, spec_port=0, base_port=0, time_scale=0.1, once=True)
    assert all(r.status == 200 for r in results) and len(results) == len(SAMPLES)
    first, second, first_chat = results[0], results[1], results[2]
    assert first.label.startswith("copy-heavy") and second.label.startswith("copy-heavy")
    # A fresh gateway has measured nothing: its first decision says it rests on the prior;
    # the second edit is routed on what the first one measured.
    assert (first.route, first.reason) == ("spec", "prior")
    # Sent one at a time, each finds the pair idle and takes the engine fastest for it.
    assert (second.route, second.reason) == ("spec", "idle_pair")
    assert first_chat.label.startswith("open chat") and (first_chat.route, first_chat.reason) in (
        ("base", "idle_pair"),
        ("base", "prior"),
    )
    last = results[-1]
    assert last.label.startswith("min_p") and (last.route, last.reason) == ("base", "refused_params")
    assert all(r.reason for r in results) and all(r.tokens > 0 for r in results)
    out = capsys.readouterr().out
    assert "route=spec" in out and "route=base" in out


async def test_the_demo_gateway_is_wired_as_serve_wires_it(caplog: pytest.LogCaptureFixture) -> None:
    """Its /metrics has the gateway's own families and every request leaves an access line."""
    scraped: list[str] = []

    async def scrape(url: str) -> None:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            assert r.status == 200
            scraped.append(await r.text())

    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        results = await run_demo(
            port=0, spec_port=0, base_port=0, time_scale=0.1, once=True, after_samples=scrape
        )
    (text,) = scraped
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE specgate_")}
    assert "specgate_request_duration_seconds" in families, sorted(families)
    assert "\nspecgate_requests_total{" in text
    assert 'route="spec"' in text and 'route="base"' in text
    access = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(access) == len(results)
