"""The overhead benchmark's null Endpoint Picker answers every phase as specgate's EPP does,
routed to its one endpoint, through a real gRPC client; and the in-process measure of the
one-trip path writes the answers on the request's own read."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import grpc
import pytest

from gateway.envoy.messages import DESTINATION
from tests.deploy.helpers import load_module
from tests.epp.extproc_wire import (
    Response,
    parse_response,
    process_call,
    request_body,
    request_headers,
    response_headers,
)

LOADTESTS = Path(__file__).resolve().parents[2] / "loadtests"
ENDPOINT = "127.0.0.1:8123"
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def null_epp() -> ModuleType:
    return load_module(LOADTESTS / "null_epp.py", "specgate_null_epp")


@pytest.fixture
async def channel(null_epp: ModuleType, tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    port_file = tmp_path / "port"
    listening = asyncio.Event()
    task = asyncio.create_task(null_epp.serve(ENDPOINT, str(port_file), listening))
    async with asyncio.timeout(TIMEOUT_S):
        await listening.wait()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port_file.read_text()}")
    try:
        yield ch
    finally:
        await ch.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _exchange(ch: grpc.aio.Channel, sent: list[bytes], answers: int) -> list[Response]:
    call = process_call(ch)
    out = []
    async with asyncio.timeout(TIMEOUT_S):
        for message in sent:
            await call.write(message)
        for _ in range(answers):
            out.append(parse_response(await call.read()))
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    return out


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_one_trip_the_headers_answer_routes_then_the_body_passes(channel: grpc.aio.Channel) -> None:
    sent = [request_headers(streamed=True, without_waiting=True), request_body(BODY)]
    first, second = await _exchange(channel, sent, 2)
    assert first.kind == "request_headers" and first.set_headers[DESTINATION] == ENDPOINT
    assert first.dynamic_metadata["envoy.lb"][DESTINATION] == ENDPOINT
    assert second.kind == "request_body" and second.body is None and not second.clear_body


async def test_buffered_the_body_answer_routes(channel: grpc.aio.Channel) -> None:
    sent = [request_headers(), request_body(BODY), response_headers(200)]
    head, body, resp = await _exchange(channel, sent, 3)
    assert head.kind == "request_headers" and DESTINATION not in head.set_headers
    assert body.kind == "request_body" and body.set_headers[DESTINATION] == ENDPOINT
    assert resp.kind == "response_headers"


async def test_a_request_without_a_body_is_routed_on_its_headers(channel: grpc.aio.Channel) -> None:
    """GET /health through the one-trip filter: no body is coming, so the headers route."""
    sent = [request_headers("/health", "GET", eos=True, streamed=True, without_waiting=True)]
    (only,) = await _exchange(channel, sent, 1)
    assert only.kind == "request_headers" and only.set_headers[DESTINATION] == ENDPOINT


def test_the_one_trip_measure_answers_on_the_requests_read() -> None:
    """``epp_cpu.py --one-trip`` asserts the answers were written on the request's own read
    (and that no stream is left open); its critical path is part of its whole."""
    out = subprocess.run(
        [
            sys.executable,
            str(LOADTESTS / "epp_cpu.py"),
            "--short",
            "--one-trip",
            "--requests",
            "40",
            "--warmup",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["one_trip"] is True
    assert 0 < got["critical_us"] <= got["cpu_us_per_request"]
