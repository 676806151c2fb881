"""The Redis transport against a real redis-server (the Debian package; skipped without it
locally, a failure under CI=true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.peers.redis_bus import RedisBus
from tests.peers.helpers import redis_server, within

pytestmark = pytest.mark.timeout(60)


async def test_a_started_bus_hears_every_message_published_after(tmp_path: Path) -> None:
    """``start`` returns once Redis has confirmed the subscription: a message published
    the moment after, before the replica ever asks for one, reaches it. (A SUBSCRIBE sent
    but not yet processed by Redis loses it: a replica started on a loaded machine missed
    the first messages of the others, a request's count among them.)"""
    async with redis_server(tmp_path) as url:
        rx, tx = RedisBus(url, "t"), RedisBus(url, "t")
        try:
            await within("subscribing", rx.start(), 10)
            await within("publishing", tx.publish(b"one"), 10)
            assert await within("the message published after start", rx.receive(), 10) == b"one"
        finally:
            await within("closing the buses", rx.close(), 10)
            await within("closing the buses", tx.close(), 10)
