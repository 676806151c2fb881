"""Envoy's access log streamed to the EPP (``envoy-config --access-log``), through real Envoy.

Whatever the ext_proc mode shows the EPP of a response, the access log entry tells it how
each request ended: the request holds its slot to the answer's end and is counted with the
status Envoy answered, as in the proxy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.api.epp.server import EPP
from gateway.api.state import STATE
from gateway.envoy.accesslog import LogEntry
from specgate_lab.emulator.launch import EmulatorGroup
from tests.epp.envoy_proc import needs_envoy
from tests.epp.test_envoy_e2e import MESSAGES, _body_mode, client, epp_config, phases, stack

pytestmark = needs_envoy

WAIT_S = 20.0


class Entries:
    """The access log entries the EPP is given, as they come."""

    def __init__(self, app: Any) -> None:
        self.seen: list[LogEntry] = []
        self.arrived = asyncio.Event()
        endings = app[EPP].endings
        deliver = endings.deliver

        def recording(entries: list[LogEntry]) -> None:
            self.seen.extend(entries)
            deliver(entries)
            self.arrived.set()

        endings.deliver = recording

    async def until(self, n: int) -> None:
        """Wait for ``n`` entries in all."""
        async with asyncio.timeout(WAIT_S):
            while len(self.seen) < n:
                self.arrived.clear()
                await self.arrived.wait()


async def _warm(app: Any, c: Any, entries: Entries) -> None:
    """Envoy opens its access log stream with its first entry: one request first."""
    await c.chat.completions.create(model="qwen3-8b", messages=MESSAGES, max_tokens=4)
    await entries.until(1)
    assert app[EPP].endings.live


@pytest.mark.parametrize("body_mode", ["BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED"])
async def test_with_the_access_log_a_request_holds_its_slot_to_the_end_and_counts_its_status(
    pair: EmulatorGroup, tmp_path: Path, body_mode: str
) -> None:
    """Unwatched, in every body mode: the slot is held while the answer streams (Envoy ends
    the one-trip and full duplex streams long before), and the request is counted 200 from
    its entry. A client gone mid-answer is counted 499, as in the proxy."""
    cfg = epp_config(pair, **{"epp.observe_per_s": 0})
    edit = _body_mode(body_mode) if body_mode != "BUFFERED" else (lambda boot: boot)
    async with stack(cfg, tmp_path, edit, access_log=True) as (envoy, app):
        entries = Entries(app)
        c = await client(envoy)
        try:
            seen = phases(app)
            await _warm(app, c, entries)
            # long enough (ignore_eos: all of it) that the engine is still decoding when the
            # client reads the first chunk, on a loaded machine too (24 tokens could all be
            # sent, and the entry logged, before the client read one)
            stream = await c.chat.completions.create(
                model="qwen3-8b",
                messages=MESSAGES,
                max_tokens=1000,
                temperature=0,
                stream=True,
                extra_headers={"x-specgate-route": "base"},
                extra_body={"ignore_eos": True},
            )
            chunks = 0
            async for _chunk in stream:
                if chunks == 0:  # mid-answer: the slot is held, whatever the mode
                    assert app[STATE].inflight == 1
                chunks += 1
            assert chunks > 2
            await entries.until(2)
            assert app[STATE].inflight == 0
            # the first, routed before Envoy opened its access log, is finished as without it:
            # unobserved, but in full duplex (its response headers came)
            first = 200 if body_mode == "FULL_DUPLEX_STREAMED" else 0
            assert seen.finished == [(first, None), (200, None)]
            # An id specgate does not keep (not [A-Za-z0-9._:-]) is replaced on the request:
            # Envoy logs the replacement, and the entry still finds its request.
            await c.chat.completions.create(
                model="qwen3-8b", messages=MESSAGES, max_tokens=4, extra_headers={"x-request-id": "a b/c"}
            )
            await entries.until(3)
            assert seen.finished[-1] == (200, None)

            cut = await c.chat.completions.create(
                model="qwen3-8b",
                messages=MESSAGES,
                max_tokens=4000,  # seconds of decoding: the client leaves long before
                temperature=0,
                stream=True,
                extra_headers={"x-specgate-route": "base"},
            )
            async for _chunk in cut:
                break
            assert app[STATE].inflight == 1
            await cut.close()
            await entries.until(4)
        finally:
            await c.close()
        assert await app[STATE].drain(10.0)
        assert seen.finished[1:] == [(200, None), (200, None), (499, "client_disconnected")]
        engine = app[STATE].models["qwen3-8b"].engines
        assert all(e.inflight == 0 for e in engine.values())
