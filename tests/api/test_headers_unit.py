"""Header helpers: request ids and hop-by-hop filtering (pure functions)."""

from __future__ import annotations

from multidict import CIMultiDict

from gateway.api.headers import downstream_headers, new_request_id, request_id, upstream_headers


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
    assert dict(upstream_headers(h)) == {"X-Keep": "2"}
    assert dict(downstream_headers(h)) == {"X-Keep": "2"}
