"""The overhead benchmark's raw HTTP client knows exactly when a response has ended."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.helpers import load_module

BENCH = Path(__file__).resolve().parents[2] / "loadtests" / "bench_overhead.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_module(BENCH, "specgate_bench_overhead")


def test_content_length_body_complete_only_when_all_bytes_came(bench: ModuleType) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
    assert bench._parse_response(bytearray(head + b'{"a":')) is None
    assert bench._parse_response(bytearray(head + b'{"a":12345}')) == (200, b'{"a":12345}')


def test_chunked_body_complete_only_after_the_last_chunk(bench: ModuleType) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    part = head + b"e\r\ndata: [DONE]\n\n\r\n"
    assert bench._parse_response(bytearray(part)) is None
    assert bench._parse_response(bytearray(part + b"0\r\n")) is None
    assert bench._parse_response(bytearray(part + b"0\r\n\r\n")) == (200, b"data: [DONE]\n\n")


def test_status_of_an_error_answer(bench: ModuleType) -> None:
    raw = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}"
    assert bench._parse_response(bytearray(raw)) == (503, b"{}")
