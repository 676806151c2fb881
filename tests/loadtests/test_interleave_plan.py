"""The interleaved-window harness serves static slots by pinning its one gateway, so the
adaptive gateway never sees requests it did not send."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.helpers import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "loadtests" / "gpu" / "interleave.py"


@pytest.fixture(scope="module")
def il() -> ModuleType:
    return load_module(SCRIPT, "specgate_interleave")


def test_one_gateway_pins_the_static_slots_and_unpins_adaptive(il: ModuleType) -> None:
    plan = il.gateway_plan(["adaptive", "always-spec", "always-base", "adaptive"], "one")
    assert plan == {
        "adaptive": ("adaptive", "auto"),
        "always-spec": ("adaptive", "spec"),
        "always-base": ("adaptive", "base"),
    }


def test_one_gateway_cannot_serve_two_non_static_policies(il: ModuleType) -> None:
    with pytest.raises(SystemExit, match="per-policy"):
        il.gateway_plan(["adaptive", "temperature"], "one")
    plan = il.gateway_plan(["adaptive", "temperature"], "per-policy")
    assert plan == {"adaptive": ("adaptive", None), "temperature": ("temperature", None)}


def test_static_slots_alone_still_run_behind_an_adaptive_gateway(il: ModuleType) -> None:
    assert il.gateway_plan(["always-spec", "always-base"], "one") == {
        "always-spec": ("adaptive", "spec"),
        "always-base": ("adaptive", "base"),
    }


def test_the_stream_moves_a_slot_saved_are_read_from_the_gateways_own_page(il: ModuleType) -> None:
    """What a flip cost is in the moves: each state line keeps the gateway's counters."""
    from gateway.telemetry.metrics import GatewayMetrics

    m = GatewayMetrics(process_metrics=False)
    assert il.stream_moves(m.exposition().decode()) == {}
    m.stream_moves.labels("eagle3-lo", "moved").inc(3)
    m.stream_moves.labels("eagle3-lo", "too_few_tokens_left").inc()
    m.stream_moves.labels("base", "moved").inc(2)
    assert il.stream_moves(m.exposition().decode()) == {
        "eagle3-lo/moved": 3.0,
        "eagle3-lo/too_few_tokens_left": 1.0,
        "base/moved": 2.0,
    }
