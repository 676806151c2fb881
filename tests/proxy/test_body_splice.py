"""The upstream body is spliced from the client's bytes only when that is exact."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy.body import splice_model


def _expected(body: dict[str, Any], served: str, add_usage: bool) -> dict[str, Any]:
    out = dict(body, model=served)
    if add_usage:
        out["stream_options"] = {"include_usage": True}
    return out


@pytest.mark.parametrize("add_usage", [False, True])
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
        b'{ "messages" : [] , "model" : "m" }\n',
        b'{"model":"m","stream":true,"content":"caf\\u00e9 \xc3\xa9"}',
        b'{"model":"m","messages":[{"role":"user","content":"the word \\"mode\\" is"}]}',
    ],
)
def test_splice_equals_reserialised(raw: bytes, add_usage: bool) -> None:
    out = splice_model(raw, "m", "served/name", add_usage=add_usage)
    assert out is not None
    assert json.loads(out) == _expected(json.loads(raw), "served/name", add_usage)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model":"m","model":"m"}',  # duplicate key: the last one wins, leave it to the parser
        b'{"model":"m","tools":[{"parameters":{"model":"m"}}]}',  # nested key of the same name
        b'{"mod\\u0065l":"m","tools":[{"x":{"model":"m"}}]}',  # top-level key spelled with escapes
        b'{"say \\"model":"m","model":"m"}',  # "model" bytes at the end of another key
        b'\xef\xbb\xbf{"model":"m"}',  # BOM
        '{"model":"m"}'.encode("utf-16"),
        b'{"model":"other"}',  # not the name the gateway validated
    ],
)
def test_splice_refuses_when_not_provably_exact(raw: bytes) -> None:
    assert splice_model(raw, "m", "s", add_usage=False) is None


def test_existing_stream_options_left_to_the_parser() -> None:
    raw = b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}'
    assert splice_model(raw, "m", "s", add_usage=True) is None
    assert splice_model(raw, "m", "s", add_usage=False) == raw.replace(b'"m"', b'"s"', 1)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(
    extra=st.dictionaries(st.text(max_size=8), _json, max_size=4),
    model=st.text(min_size=1, max_size=12),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 1]),
    add_usage=st.booleans(),
)
def test_splice_never_changes_meaning(
    extra: dict[str, Any], model: str, ascii_only: bool, indent: int | None, add_usage: bool
) -> None:
    body = {**extra, "model": model}
    raw = json.dumps(body, ensure_ascii=ascii_only, indent=indent).encode("utf-8", "surrogatepass")
    out = splice_model(raw, model, "served", add_usage=add_usage)
    if out is not None:  # when it splices, the result is what re-serialising would send
        assert json.loads(out) == _expected(body, "served", add_usage)
