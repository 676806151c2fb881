"""Timeouts are attributed to the side that caused them: a hung engine costs a client one
attempt's budget before the sibling answers, a retry is never blamed for what the first
attempt used, and a client that stops reading never gets a healthy engine ejected."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp

from gateway.api.state import STATE
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import Harness, harness

SPEC_REQ = {
    "model": "m1",
    "messages": [{"role": "user", "content": "copy this"}],
    "temperature": 0.0,
    "max_tokens": 16,
}
FAST = {"first_byte_s": 0.3, "nonstream_token_s": 0.01, "total_s": 20.0}


def _healthy(h: Harness, name: str) -> bool:
    return bool(h.app[STATE].models["m1"].engines[name].healthy())


async def _post(url: str, body: dict[str, object]) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, dict(r.headers), await r.read()


async def test_hung_engine_non_stream_fails_over_within_one_attempt_budget() -> None:
    spec = FakeEngine("m1-spec", hang_before_headers=True)
    retry = {"failures_to_unhealthy": 3, "cooldown_s": 60}
    async with harness(spec=spec, timeouts=FAST, retry=retry) as h:
        for stream in (False, True, False, False, False):
            t0 = time.monotonic()
            status, headers, body = await _post(h.url("/v1/chat/completions"), {**SPEC_REQ, "stream": stream})
            assert status == 200, body
            assert headers["x-specgate-route"] == "base"
            # one attempt's budget: 0.3 s + 16 tokens x 0.01 s (the total is 20 s)
            assert time.monotonic() - t0 < 5.0
        assert _healthy(h, "base0")  # the sibling that answered is never blamed
        assert not _healthy(h, "spec0")  # the hung one is
        status, headers, _ = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert (status, headers["x-specgate-reason"]) == (200, "spec_down")


async def test_a_retry_is_not_blamed_for_the_time_the_first_attempt_used() -> None:
    """The total is a client-level cap: when it, not the engine's own budget, runs out
    during the retry, the retried engine keeps its health."""
    spec = FakeEngine("m1-spec", hang_before_headers=True)
    base = FakeEngine("m1-base", hang_before_headers=True)
    timeouts = {"first_byte_s": 0.2, "nonstream_token_s": 0.01, "total_s": 0.5}
    async with harness(spec=spec, base=base, timeouts=timeouts, retry={"failures_to_unhealthy": 1}) as h:
        status, _, body = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert status == 504
        assert json.loads(body)["error"]["code"] == "upstream_timeout"
        assert not _healthy(h, "spec0")  # had its whole budget
        assert _healthy(h, "base0")  # had 0.14 s of its 0.36 s


def _stalled_client(port: int, body: bytes) -> socket.socket:
    """A client with a tiny receive buffer that sends a streaming request and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    s.sendall(head + body)
    return s


def _read_until_closed(s: socket.socket) -> bytes:
    s.settimeout(10)
    got = b""
    try:
        while chunk := s.recv(1 << 16):
            got += chunk
    except ConnectionResetError:
        pass  # the gateway cut it (a reset once the buffered bytes were read)
    return got


async def test_a_client_that_stops_reading_never_gets_an_engine_ejected() -> None:
    tokens = ["x" * 1000] * 20000  # ~20 MB of events: far more than any socket buffers
    spec = FakeEngine("m1-spec", tokens=tokens)
    timeouts = {"client_stall_s": 0.5, "idle_s": 0.3}
    async with harness(spec=spec, timeouts=timeouts, retry={"failures_to_unhealthy": 1}) as h:
        port = h.gateway.port
        assert port is not None
        body = json.dumps({**SPEC_REQ, "stream": True, "max_tokens": 40000}).encode()
        sock = await asyncio.to_thread(_stalled_client, port, body)
        try:
            # The engine request is aborted once the client's stall limit runs out...
            await asyncio.wait_for(spec.aborted.wait(), 10)
            # ... and the stalled client's connection is cut by the gateway.
            data = await asyncio.to_thread(_read_until_closed, sock)
            assert data.startswith(b"HTTP/1.1 200")
            assert _healthy(h, "spec0") and _healthy(h, "base0")
            spec.tokens = ["Hello"]
            status, headers, _ = await _post(h.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
            assert (status, headers["x-specgate-route"]) == (200, "spec")  # still in service
        finally:
            sock.close()
