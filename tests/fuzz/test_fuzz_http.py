"""Property-based fuzzing of request bodies and headers against the real gateway app and the
emulated pair: no 5xx, no crash, no traceback to the client (a few hundred deterministic
cases here; ``loadtests/fuzz_bench.py`` runs ≥ 10,000)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.hostile import Case, cases, check, send
from tests.reliability.rig import rig

CI_CASES = 300


def _fuzz(port: int, n: int) -> int:
    """Run the property in this (worker) thread; returns how many cases were sent."""
    sent = 0

    @settings(
        max_examples=n,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(cases())
    def prop(case: Case) -> None:
        nonlocal sent
        status, headers, body = send("127.0.0.1", port, case)
        sent += 1
        check(case, status, headers, body)

    prop()
    return sent


async def test_hostile_bodies_and_headers_never_5xx_or_leak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with rig(time_scale=0.001, scrape={"enabled": False}) as r:
        sent = await asyncio.to_thread(_fuzz, r.gateway.port or 0, CI_CASES)
        assert sent >= CI_CASES
        # Still healthy afterwards: nothing in flight, a normal request works.
        assert r.state.inflight == 0
        status, _, _ = await asyncio.to_thread(
            send,
            "127.0.0.1",
            r.gateway.port or 0,
            Case(
                "/v1/chat/completions",
                b'{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":3}',
            ),
        )
        assert status == 200
    # No unhandled error was logged on the way (an exception would be an internal error).
    assert not [rec for rec in caplog.records if rec.name.startswith(("gateway", "aiohttp"))]
