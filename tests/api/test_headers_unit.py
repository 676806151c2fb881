"""Header helpers: request ids and hop-by-hop filtering (pure functions)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from gateway.wire.headers import downstream_headers, new_request_id, request_id, upstream_headers


def test_generated_request_ids_are_unique_hex() -> None:
    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_request_id_accepts_safe_values_only() -> None:
    assert request_id("abc-DEF_1.2:3") == "abc-DEF_1.2:3"
    for bad in ("", "a b", "a\r\nX-Evil: 1", "x" * 129, "é", None):
        rid = request_id(bad)
        assert rid != bad and len(rid) == 32


def test_connection_listed_headers_are_hop_by_hop_both_ways() -> None:
    h = CIMultiDict(
        {"Connection": "close, X-Drop", "X-Drop": "1", "X-Keep": "2", "Content-Type": "application/json"}
    )
    assert dict(upstream_headers(h, {"x-keep", "x-drop"})) == {"X-Keep": "2"}
    assert dict(downstream_headers(h)) == {"X-Keep": "2"}


def test_only_allow_listed_client_headers_go_upstream() -> None:
    h = CIMultiDict(
        {
            "Accept": "application/json",
            "User-Agent": "openai-python/1.0",
            "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
            "Authorization": "Bearer client-key",
            "Cookie": "a=b",
            "X-Forwarded-For": "1.2.3.4",
            "X-Custom": "1",
            "x-request-id": "abc",
            "Content-Type": "application/json",
        }
    )
    for i in range(120):
        h.add(f"X-Noise-{i}", "v")
    assert dict(upstream_headers(h)) == {
        "Accept": "application/json",
        "User-Agent": "openai-python/1.0",
        "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
    }
    assert dict(upstream_headers(h, {"x-custom"})) == {**upstream_headers(h), "X-Custom": "1"}


def test_forward_headers_setting_refuses_credentials_and_framing() -> None:
    from gateway.wire.headers import check_forwardable

    assert check_forwardable(" X-Tenant ") == "x-tenant"
    for bad in (
        "Authorization",
        "cookie",
        "Host",
        "content-length",
        "Connection",
        "x-forwarded-for",
        "proxy-foo",
        "x-specgate-route",
        "bad header",
        "a:b",
        "",
    ):
        with pytest.raises(ValueError):
            check_forwardable(bad)
