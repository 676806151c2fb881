"""Each candidate HTTP/2 stack of the EPP benchmark (``loadtests/epp_stacks``) answers an
ext_proc exchange as the null EPP does, through a real gRPC client: the one-trip layout
(the headers' answer routes) and the buffered one ended by the client (status OK). Cheap:
in-process servers, no Envoy."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from hyperframe.frame import Frame, GoAwayFrame, PingFrame, SettingsFrame

from gateway.envoy.messages import DESTINATION
from tests.deploy.helpers import load_module
from tests.epp.extproc_wire import PROCESS, parse_response, request_body, request_headers, response_headers

STACKS_DIR = Path(__file__).resolve().parents[2] / "loadtests" / "epp_stacks"
ENDPOINT = "127.0.0.1:8123"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def stacks() -> ModuleType:
    sys.path.insert(0, str(STACKS_DIR))
    return load_module(STACKS_DIR / "stacks.py", "specgate_epp_stacks")


def _running(stacks: ModuleType, stack: str) -> Iterator[int]:
    running = stacks.start(stack, ENDPOINT)
    try:
        yield running.port
    finally:
        running.stop()


@pytest.mark.parametrize("stack", ["hand", "h2", "grpc-sync", "grpc-aio", "grpc-sync-hop", "grpc-aio-hop"])
def test_each_stack_answers_an_ext_proc_exchange(stacks: ModuleType, stack: str) -> None:
    assert stack in stacks.STACKS
    for port in _running(stacks, stack):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(PROCESS)
            one_trip = [request_headers(streamed=True, without_waiting=True), request_body(BODY)]
            answers = call(iter(one_trip), timeout=TIMEOUT_S)
            first, second = parse_response(next(answers)), parse_response(next(answers))
            answers.cancel()  # as Envoy resets the stream once answered
            assert first.kind == "request_headers" and first.set_headers[DESTINATION] == ENDPOINT
            assert second.kind == "request_body"
            buffered = [request_headers(), request_body(BODY), response_headers(200)]
            got = [parse_response(r) for r in call(iter(buffered), timeout=TIMEOUT_S)]  # ends: status OK
            assert [r.kind for r in got] == ["request_headers", "request_body", "response_headers"]
            assert got[1].set_headers[DESTINATION] == ENDPOINT


def test_the_h2_prototype_ends_a_ping_flood_with_enhance_your_calm(stacks: ModuleType) -> None:
    """The budget ``h2`` lacks, added by the prototype: PINGs past the second's budget end
    the connection with GOAWAY ENHANCE_YOUR_CALM (0xb)."""
    for port in _running(stacks, "h2"):
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
            flood = b"".join(PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize() for i in range(200))
            sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize() + flood)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        frames = []
        while len(data) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(data[:9]))
            frame.parse_body(memoryview(data[9 : 9 + length]))
            frames.append(frame)
            data = data[9 + length :]
        (goaway,) = [f for f in frames if isinstance(f, GoAwayFrame)]
        assert goaway.error_code == 0xB
