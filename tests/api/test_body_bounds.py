"""Whatever a client sends, the body costs bounded memory and CPU, and a bad one is a 400
(never a 500): mismatched Content-Encoding, bombs, non-UTF-8 text, swarms of containers."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import threading
import zlib
from typing import Any

import aiohttp
import brotli
import pytest

import gateway.api.body as body_mod
from gateway.wire.errors import ApiError
from tests.proxy.harness import harness

REQ = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9}


async def _post(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    hdrs = {"Content-Type": "application/json", **headers}
    async with aiohttp.ClientSession() as s, s.post(url, data=io.BytesIO(data), headers=hdrs) as r:
        raw = await r.read()
        return r.status, json.loads(raw) if r.headers.get("Content-Type", "").startswith(
            "application/json"
        ) else {}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
async def test_a_body_that_does_not_match_its_encoding_is_a_400(encoding: str) -> None:
    async with harness() as h:
        status, body = await _post(
            h.url("/v1/chat/completions"), json.dumps(REQ).encode(), {"Content-Encoding": encoding}
        )
        assert status == 400, body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert h.base.requests == [] and h.spec.requests == []


async def test_encodings_that_decode_are_served_and_unknown_ones_refused() -> None:
    async with harness() as h:
        url = h.url("/v1/chat/completions")
        raw = json.dumps(REQ).encode()
        assert (await _post(url, gzip.compress(raw), {"Content-Encoding": "gzip"}))[0] == 200
        assert (await _post(url, zlib.compress(raw), {"Content-Encoding": "deflate"}))[0] == 200
        assert (await _post(url, brotli.compress(raw), {"Content-Encoding": "br"}))[0] == 200
        seen = len(h.base.requests)
        status, _ = await _post(url, raw, {"Content-Encoding": "zstd"})
        assert status in (400, 415)  # aiohttp's parser may refuse it before the handler does
        assert len(h.base.requests) == seen
    with pytest.raises(ApiError) as exc:
        body_mod.check_content_encoding("gzip, zstd")
    assert (exc.value.status, exc.value.code) == (415, "unsupported_encoding")


def _gzip_bomb(expanded: int) -> bytes:
    """``expanded`` bytes of spaces, gzipped in 1 MiB pieces (~1/1000 the size)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing
    piece = b" " * (1024 * 1024)
    return b"".join(z.compress(piece) for _ in range(expanded // len(piece))) + z.flush()


async def test_a_gzip_bomb_expands_no_further_than_the_body_limit() -> None:
    bomb = await asyncio.to_thread(_gzip_bomb, 64 * 1024 * 1024)  # 64 MiB in ~64 KiB
    async with harness(server={"max_body_bytes": 1024 * 1024}) as h:
        status, body = await _post(h.url("/v1/chat/completions"), bomb, {"Content-Encoding": "gzip"})
        assert status in (400, 413), body
        assert h.base.requests == [] and h.spec.requests == []


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-32", "utf-8-sig"])
async def test_json_that_is_not_plain_utf8_is_refused_before_any_engine(codec: str) -> None:
    async with harness() as h:
        raw = json.dumps(REQ).encode(codec)
        status, body = await _post(h.url("/v1/chat/completions"), raw, {})
        assert (status, body["error"]["code"]) == (400, "invalid_encoding")
        assert h.base.requests == [] and h.spec.requests == []


async def test_swarms_of_containers_are_refused_from_the_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(raw: bytes) -> dict[str, Any]:
        raise AssertionError("json was parsed")

    monkeypatch.setattr(body_mod, "parse_json", never)
    swarm = b'{"model":"m1","messages":[' + b",".join([b"{}"] * 400_000) + b"]}"
    flat = b'{"model":"m1","messages":[],"x":[' + b",".join([b"1"] * 400_000) + b"]}"
    async with harness() as h:
        for raw in (swarm, flat):
            status, body = await _post(h.url("/v1/chat/completions"), raw, {})
            assert (status, body["error"]["code"]) == (400, "body_too_complex"), body


async def test_brackets_inside_strings_do_not_count() -> None:
    """A prompt full of code braces is text: only structure counts against the limits."""
    text = "{[()]}" * 100_000
    raw = json.dumps({**REQ, "messages": [{"role": "user", "content": text}]}).encode()
    body_mod.check_shape(raw, 100, 1000)  # no raise


async def test_large_legal_bodies_are_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    real = body_mod.parse_json

    def spy(raw: bytes) -> dict[str, Any]:
        threads.append(threading.get_ident())
        return real(raw)

    monkeypatch.setattr(body_mod, "parse_json", spy)
    big = {**REQ, "messages": [{"role": "user", "content": "x" * (600 * 1024)}]}
    async with harness() as h:
        status, _ = await _post(h.url("/v1/chat/completions"), json.dumps(big).encode(), {})
        assert status == 200
        status, _ = await _post(h.url("/v1/chat/completions"), json.dumps(REQ).encode(), {})
        assert status == 200
    main = threading.main_thread().ident
    assert threads[0] != main  # 600 KiB: in a worker thread
    assert threads[1] == main  # small: inline


def _gzip_members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(p) for p in parts)


@pytest.mark.parametrize(
    ("data", "header", "expected"),
    [
        (gzip.compress(b'{"a": 1}'), "gzip", b'{"a": 1}'),
        (_gzip_members(b'{"a": ', b"1}"), "x-gzip", b'{"a": 1}'),  # two members, one body
        (zlib.compress(b"[1]"), "deflate", b"[1]"),
        (zlib.compress(b"[1]")[2:-4], "deflate", b"[1]"),  # raw deflate, as some clients send
        (gzip.compress(zlib.compress(b"[2]")), "deflate, gzip", b"[2]"),  # last applied, first undone
        (b"[3]", "identity", b"[3]"),
        (b"[3]", None, b"[3]"),
    ],
)
def test_bodies_decode_as_their_content_encoding(data: bytes, header: str | None, expected: bytes) -> None:
    assert body_mod.decode_body(data, header, 1024) == expected


def test_brotli_bodies_decode() -> None:  # brotli is a runtime dependency: br always accepted
    assert body_mod.decode_body(brotli.compress(b'{"b": 2}'), "br", 1024) == b'{"b": 2}'
    with pytest.raises(ApiError) as exc:
        body_mod.decode_body(brotli.compress(b"x" * 2000), "br", 1024)
    assert exc.value.status == 413
    with pytest.raises(ApiError) as exc:
        body_mod.decode_body(brotli.compress(b"x" * 2000)[:-3], "br", 4096)
    assert exc.value.status == 400


@pytest.mark.parametrize(
    ("data", "header"),
    [
        (gzip.compress(b"[1]")[:-5], "gzip"),  # cut short
        (gzip.compress(b"[1]") + b"junk", "gzip"),  # trailing bytes that are no member
        (zlib.compress(b"[1]") + b"junk", "deflate"),
        (b"[1]", "gzip"),  # not compressed at all
    ],
)
def test_a_body_that_does_not_decode_is_a_400(data: bytes, header: str) -> None:
    with pytest.raises(ApiError) as exc:
        body_mod.decode_body(data, header, 1024)
    assert (exc.value.status, exc.value.code) == (400, "invalid_body")


def test_decoding_stops_one_byte_past_the_limit() -> None:
    exact = gzip.compress(b"x" * 1024)
    assert len(body_mod.decode_body(exact, "gzip", 1024)) == 1024
    with pytest.raises(ApiError) as exc:
        body_mod.decode_body(gzip.compress(b"x" * 1025), "gzip", 1024)
    assert (exc.value.status, exc.value.code) == (413, "request_too_large")
    # a stack of codings is bounded at every layer, not only the last
    with pytest.raises(ApiError):
        body_mod.decode_body(gzip.compress(gzip.compress(b"x" * 4096)), "gzip, gzip", 1024)
