"""``/metrics`` that is slow, failing or garbage: data becomes unknown, routing carries on
with its safe default, and nothing loops or floods the log."""

from __future__ import annotations

import logging
import time

import aiohttp
import pytest

from tests.reliability.rig import COPY_PROMPT, SPEC, Rig, chat, post, rig, until

ADAPTIVE = {"policy": "adaptive"}


def _stale(r: Rig, name: str) -> bool:
    return r.engine(name).view(time.monotonic(), r.state.config.scrape.stale_after_s).stale


def _scrapes(r: Rig, engine: str) -> float:
    total = 0.0
    for fam in r.telemetry.registry.collect():
        for smp in fam.samples:
            if smp.name == "specgate_engine_scrapes_total" and smp.labels.get("engine") == engine:
                total += smp.value
    return total


@pytest.mark.parametrize(
    ("knobs", "error"),
    [
        ({"garbage_metrics": True}, ("parse", "no vllm metrics")),
        ({"metrics_delay_s": 5.0}, ("timeout",)),
    ],
    ids=["garbage", "slow"],
)
async def test_bad_metrics_mark_data_unknown_and_routing_keeps_serving(
    knobs: dict[str, object], error: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    async with rig(routing=ADAPTIVE) as r, aiohttp.ClientSession() as s:
        await until(lambda: not _stale(r, "spec0") and not _stale(r, "base0"), 5, "first scrapes")
        warm = await post(s, r.url("/v1/chat/completions"), chat(COPY_PROMPT, temperature=0.0, max_tokens=20))
        assert warm.status == 200
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="gateway"):
            r.faults(SPEC, **knobs)
            await until(lambda: _stale(r, "spec0"), 5, "spec data unknown")
            scrape = r.engine("spec0").scrape
            assert (
                scrape is not None and scrape.last_error is not None and scrape.last_error.startswith(error)
            )
            # Unknown is not zero: the view carries no numbers at all.
            view = r.engine("spec0").view(time.monotonic(), r.state.config.scrape.stale_after_s)
            assert (
                view.stats.running is None
                and view.stats.acceptance_rate is None
                and view.stats.tpot_s is None
            )
            # Routing decides on its prior and every request still succeeds.
            for body in (
                chat(COPY_PROMPT, temperature=0.0, max_tokens=20),
                chat(temperature=0.9, max_tokens=20),
            ):
                reply = await post(s, r.url("/v1/chat/completions"), body)
                assert reply.status == 200 and reply.headers["x-specgate-route"] in ("spec", "base")
            # Keep failing for a while: scrapes stay paced, the log stays quiet.
            t0, n0 = time.monotonic(), _scrapes(r, "spec0")
            await until(lambda: _scrapes(r, "spec0") >= n0 + 5, 10, "five more failed scrapes")
            elapsed = time.monotonic() - t0
            interval = r.state.config.scrape.interval_s
            assert _scrapes(r, "spec0") - n0 <= elapsed / interval + 2  # no tight error loop
            assert r.engine("spec0").active_healthy  # /health is fine: metrics trouble is not death
        noisy = [rec for rec in caplog.records if rec.levelno >= logging.INFO]
        assert len(noisy) <= 1, [rec.getMessage() for rec in noisy]
        # Recovery: good pages again make the data fresh.
        r.faults(SPEC, garbage_metrics=False, metrics_delay_s=0.0)
        await until(lambda: not _stale(r, "spec0"), 5, "spec data fresh again")
