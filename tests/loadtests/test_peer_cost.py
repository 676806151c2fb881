"""The peer channel's cost script times each kind of message on a real peer service, which
takes every one of them (none refused as invalid)."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.helpers import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "loadtests" / "peer_cost.py"


async def test_every_kind_of_message_is_timed() -> None:
    pc = load_module(SCRIPT, "specgate_peer_cost")
    us, received = await pc.measure(5)
    assert set(us) == {"witness", "outcome", "counts"}
    assert all(v > 0 for v in us.values())
    assert received == 3 * 5
