"""`specgate demo` routes its sample requests through the gateway in front of the emulated pair."""

from __future__ import annotations

import pytest

from gateway.lab.demo import run_demo

pytestmark = pytest.mark.timeout(60)


async def test_demo_routes_samples_through_the_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    results = await run_demo(port=0, spec_port=0, base_port=0, time_scale=0.1, once=True)
    assert [r.status for r in results] == [200, 200, 200]
    by_label = {r.label.split(",")[0].split(" (")[0]: r for r in results}
    assert by_label["copy-heavy code edit"].route == "spec"
    assert by_label["min_p"].route == "base"  # hard rule: the spec engine refuses min_p
    assert all(r.reason for r in results) and all(r.tokens > 0 for r in results)
    out = capsys.readouterr().out
    assert "route=spec" in out and "route=base" in out
