"""A huge prompt costs the event loop nothing: its body is scanned, parsed and turned into
routing features in a worker thread, and the byte scan that guards the parser is linear
with small constants and hands the interpreter back between slices. (The suite's
blocking-call guard fails any test here whose loop callback computes for too long.)"""

from __future__ import annotations

import asyncio
import io
import json
import random
import re
import string
import threading
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.api.body as body_mod
from tests.proxy.harness import harness

# The reference: blank every JSON string with a regex, then count what is left.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def _reference(raw: bytes) -> tuple[int, int]:
    skeleton = _STRING.sub(b'""', raw)
    containers = skeleton.count(b"{") + skeleton.count(b"[")
    return containers, containers + skeleton.count(b",")


def _prose(chars: int) -> str:
    rnd = random.Random(7)
    words = ["".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 9))) for _ in range(2000)]
    return " ".join(rnd.choice(words) for _ in range(chars // 5 + 1))[:chars]


def _chat_body(text: str) -> bytes:
    return json.dumps({"model": "m1", "messages": [{"role": "user", "content": text}]}).encode()


async def test_an_8mb_single_message_prompt_is_served_with_features_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: dict[str, int] = {}
    real_features, real_counts = body_mod.parse_request, body_mod.structure_counts

    def features(*args: Any, **kwargs: Any) -> Any:
        threads["features"] = threading.get_ident()
        return real_features(*args, **kwargs)

    def counts(*args: Any, **kwargs: Any) -> Any:
        threads["exact_scan"] = threading.get_ident()
        return real_counts(*args, **kwargs)

    monkeypatch.setattr(body_mod, "parse_request", features)
    monkeypatch.setattr(body_mod, "structure_counts", counts)
    raw = await asyncio.to_thread(lambda: _chat_body(_prose(8_000_000 - 200)))
    async with harness(server={"max_body_bytes": 9_000_000}) as h, aiohttp.ClientSession() as s:
        hdrs = {"Content-Type": "application/json"}
        async with s.post(h.url("/v1/chat/completions"), data=io.BytesIO(raw), headers=hdrs) as r:
            assert r.status == 200, await r.text()
        assert len(h.spec.requests + h.base.requests) == 1
        assert threads["features"] != threading.main_thread().ident
        assert "exact_scan" not in threads  # prose: the raw counts already prove the limits hold
        small = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(h.url("/v1/chat/completions"), json=small) as r:
            assert r.status == 200
        assert threads["features"] == threading.main_thread().ident  # small: inline


async def test_a_prompt_of_code_is_scanned_exactly_and_served() -> None:
    text = "f(a, [b, {c}])\n" * 200_000  # 3 MB of brackets and commas, all inside one string
    raw = await asyncio.to_thread(_chat_body, text)
    assert raw.count(b",") > 200_000  # over the elements limit before strings are told apart
    async with harness() as h, aiohttp.ClientSession() as s:
        hdrs = {"Content-Type": "application/json"}
        async with s.post(h.url("/v1/chat/completions"), data=io.BytesIO(raw), headers=hdrs) as r:
            assert r.status == 200, await r.text()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='{[,"\\\u00e9]}ab:'),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text('{["\\,'), inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.sampled_from([1, 2, 3, 7]))
def test_structure_counts_match_the_string_blanking_reference(value: Any, slice_bytes: int) -> None:
    raw = json.dumps(value, ensure_ascii=bool(slice_bytes % 2)).encode()
    old = body_mod._SLICE_BYTES
    body_mod._SLICE_BYTES = slice_bytes  # quote parity must carry across every slice boundary
    try:
        assert body_mod.structure_counts(raw, 10**9, 10**9) == _reference(raw)
    finally:
        body_mod._SLICE_BYTES = old


def test_the_exact_scan_stops_at_the_limit() -> None:
    raw = b"[" + b'"",' * 500_000 + b'""]'
    containers, elements = body_mod.structure_counts(raw, 100, 1000)
    assert containers == 1
    assert elements > 1000 and elements < 200_000  # stopped within a slice of the limit
