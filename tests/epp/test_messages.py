"""The ext_proc codec against Envoy's own: encodings made by Envoy's generated classes.

``fixtures/ext_proc_golden.json`` holds ProcessingRequests and ProcessingResponses
serialised by the generated Python API (``xds-protos`` 1.85, protobuf's deterministic
serialisation), with what each request must read as and the call that must write each
response. specgate does not install those classes (they replace other packages' files),
so the check is against their bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.envoy import messages as m
from gateway.envoy.protowire import ProtoError, fields, ld, struct_bytes, struct_value, uint
from gateway.wire.errors import ApiError
from tests.epp.extproc_wire import parse_response

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "ext_proc_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["requests"], ids=lambda c: c["name"])
def test_requests_read_as_envoy_wrote_them(case: dict[str, Any]) -> None:
    inc = m.parse(bytes.fromhex(case["hex"]))
    assert inc.kind == case["kind"]
    assert inc.end_of_stream is case["eos"]
    assert inc.metadata == case["metadata"]
    assert inc.full_duplex is case["full_duplex"]
    assert inc.headers == case.get("headers", {})  # the WANTED ones only, names lower-case
    assert inc.body == bytes.fromhex(case.get("body_hex", ""))


def _written(call: str, args: dict[str, Any]) -> bytes:
    if call == "routed":
        body = bytes.fromhex(args["body_hex"]) if args["body_hex"] else None
        return m.routed(args["phase"], args["endpoints"], args["headers"], body, args["tags"])
    if call == "response_headers":
        return m.response_headers(args["headers"], read_body=args["read_body"])
    if call == "full_duplex_chunk":
        return m.full_duplex_chunk(bytes.fromhex(args["body_hex"]), args["end"])
    if call == "immediate":
        err = ApiError(args["status"], args["message"], code=args["code"], headers=args["headers"])
        return m.immediate(err, args["extra"])
    assert call == "continue"
    return m.CONTINUE[args["phase"]]


@pytest.mark.parametrize("case", GOLDEN["responses"], ids=lambda c: c["name"])
def test_responses_are_byte_for_byte_what_envoys_classes_write(case: dict[str, Any]) -> None:
    ours = _written(case["call"], case["args"])
    theirs = bytes.fromhex(case["hex"])
    assert parse_response(ours) == parse_response(theirs)  # readable diff first
    assert ours == theirs


def test_struct_round_trip_and_values() -> None:
    doc = {"s": "é", "n": 2.5, "i": 3, "t": True, "f": False, "null": None, "l": [1, "x", {"k": []}], "o": {}}
    back = struct_value(struct_bytes(doc))
    assert back == {**doc, "i": 3.0}  # numbers are doubles on the wire


@pytest.mark.parametrize(
    "data",
    [b"\x80", b"\x0a\x05ab", b"\x00\x01", b"\x0b", b"\x09\x01\x02", b"\xff" * 11],
    ids=[
        "truncated varint",
        "truncated bytes",
        "field 0",
        "group wire type",
        "truncated fixed64",
        "long varint",
    ],
)
def test_malformed_bytes_raise_proto_error(data: bytes) -> None:
    with pytest.raises(ProtoError):
        list(fields(data))
    with pytest.raises(ProtoError):
        m.parse(data)


def test_a_deep_struct_is_refused_not_recursed_forever() -> None:
    doc: dict[str, Any] = {}
    inner = doc
    for _ in range(40):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(ProtoError):
        struct_value(struct_bytes(doc))


def test_unknown_fields_are_skipped() -> None:
    known = bytes.fromhex(GOLDEN["requests"][0]["hex"])
    extra = b"\x78\x01" + b"\xa2\x06\x03abc"  # field 15 varint, field 100 bytes
    assert m.parse(known + extra) == m.parse(known)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=12),
            st.builds(lambda f, b: ld(f, b), st.integers(1, 15), st.binary(max_size=300)),
            st.builds(lambda f, v: uint(f, v), st.integers(1, 15), st.integers(0, 1 << 40)),
        ),
        max_size=6,
    ).map(b"".join)
)
def test_the_fast_field_reader_reads_as_the_general_one(data: bytes) -> None:
    """``messages._fields`` (no generator, one-byte tags) gives what ``protowire.fields``
    gives, or fails as it does, on well-formed and malformed bytes alike."""
    try:
        expected = list(fields(data))
    except ProtoError:
        with pytest.raises(ProtoError):
            m._fields(data)
        return
    assert m._fields(data) == expected


def test_golden_requests_read_the_same_by_both_field_readers() -> None:
    for case in GOLDEN["requests"]:
        data = bytes.fromhex(case["hex"])
        assert m._fields(data) == list(fields(data))


def test_header_names_in_another_case_are_read_and_other_values_left_alone() -> None:
    """Names are matched whatever their case; the values of headers the EPP does not read
    are not decoded (an undecodable one costs nothing)."""
    hv = ld(1, ld(1, b"Content-Length") + ld(3, b"12")) + ld(1, ld(1, b"x-other") + ld(3, b"\xff\xfe"))
    hv += ld(1, ld(1, b":path") + ld(2, b"/v1/completions"))
    inc = m.parse(ld(2, ld(1, hv)))
    assert inc.headers == {"content-length": "12", ":path": "/v1/completions"}


@pytest.mark.parametrize("field", [1, 15, 16, 33, 2047, 2048])
def test_fields_of_any_number_are_written_as_the_reader_reads_them(field: int) -> None:
    """``ld`` and ``uint`` take one-byte tags (fields below 16) and longer ones alike."""
    data = ld(field, b"x" * 200) + uint(field, 300)
    assert list(fields(data)) == [(field, 2, b"x" * 200), (field, 0, 300)]
