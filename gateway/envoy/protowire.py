"""Protocol Buffers' wire format, the little of it the ext_proc messages need.

The EPP reads and writes Envoy's ext_proc messages with this instead of generated code:
Envoy's generated Python API (``xds-protos``) installs its own copies of other projects'
protos (``opentelemetry.proto``, ``google.api``...), which replace the real packages' files
(OpenTelemetry's OTLP exporter no longer imports beside it); and reading the few fields
the EPP uses by hand costs less than building the objects. Field numbers are Envoy's
(``envoy/service/ext_proc/v3/external_processor.proto``); the tests check every message
against encodings made by the generated classes, and real Envoy parses what this writes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from typing import Any

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5
_SMALL = [bytes((i,)) for i in range(128)]
_DOUBLE = struct.Struct("<d")


class ProtoError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


# -- reading --------------------------------------------------------------------------------


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    n = len(buf)
    while pos < n:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ProtoError("truncated or oversized varint")


def fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field: an int for VARINT, bytes for LEN and
    the fixed types (little-endian, undecoded)."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ProtoError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
            yield field, wire, value
        elif wire == LEN:
            length, pos = read_varint(buf, pos)
            end = pos + length
            if end > n:
                raise ProtoError("truncated length-delimited field")
            yield field, wire, buf[pos:end]
            pos = end
        elif wire in (FIXED64, FIXED32):
            end = pos + (8 if wire == FIXED64 else 4)
            if end > n:
                raise ProtoError("truncated fixed-size field")
            yield field, wire, buf[pos:end]
            pos = end
        else:
            raise ProtoError(f"unsupported wire type {wire}")


def index(buf: bytes, wanted: frozenset[int]) -> dict[int, Any]:
    """Each field's last value by number: an int (VARINT) for every VARINT field, bytes for
    the LEN fields in ``wanted``; other LEN fields and fixed-size ones are skipped unread.
    One pass, no generator: for messages of many fields of which a few are read (Envoy's
    access log entries); :func:`fields` reads them all, in order."""
    out: dict[int, Any] = {}
    pos, n = 0, len(buf)
    while pos < n:
        key = buf[pos]
        pos += 1
        if key >= 0x80:  # fields 16 to 2047: a two-byte tag
            if pos < n and buf[pos] < 0x80:
                key = (key & 0x7F) | buf[pos] << 7
                pos += 1
            else:
                key, pos = read_varint(buf, pos - 1)
        wire = key & 7
        if wire == VARINT:
            b = buf[pos] if pos < n else 0x80
            if b < 0x80:
                value: Any = b
                pos += 1
            elif pos + 1 < n and buf[pos + 1] < 0x80:
                value = (b & 0x7F) | buf[pos + 1] << 7
                pos += 2
            else:
                value, pos = read_varint(buf, pos)
        elif wire == LEN:
            b = buf[pos] if pos < n else 0x80
            if b < 0x80:
                pos += 1
            else:
                b, pos = read_varint(buf, pos)
            end = pos + b
            if end > n:
                raise ProtoError("truncated length-delimited field")
            if key >> 3 not in wanted:
                pos = end
                continue
            value = buf[pos:end]
            pos = end
        elif wire in (FIXED64, FIXED32):
            pos += 8 if wire == FIXED64 else 4
            if pos > n:
                raise ProtoError("truncated fixed-size field")
            continue
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        if key < 8:
            raise ProtoError("field number 0")
        out[key >> 3] = value
    return out


def struct_value(buf: bytes, depth: int = 0) -> dict[str, Any]:
    """A ``google.protobuf.Struct`` as a dict (JSON-like values)."""
    out: dict[str, Any] = {}
    for field, wire, entry in fields(buf):
        if field != 1 or wire != LEN:
            continue
        key, value = "", None
        for f, w, v in fields(entry):  # map entry: key = 1, value = 2
            if f == 1 and w == LEN:
                key = v.decode("utf-8", "replace")
            elif f == 2 and w == LEN:
                value = _value(v, depth + 1)
        out[key] = value
    return out


def _value(buf: bytes, depth: int) -> Any:
    if depth > 32:
        raise ProtoError("Struct nested too deep")
    for field, wire, v in fields(buf):
        if field == 1:  # null_value
            return None
        if field == 2 and wire == FIXED64:
            return _DOUBLE.unpack(v)[0]
        if field == 3 and wire == LEN:
            return v.decode("utf-8", "replace")
        if field == 4 and wire == VARINT:
            return bool(v)
        if field == 5 and wire == LEN:
            return struct_value(v, depth + 1)
        if field == 6 and wire == LEN:
            return [_value(x, depth + 1) for f, w, x in fields(v) if f == 1 and w == LEN]
    return None


# -- writing --------------------------------------------------------------------------------


def varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field (sub-message, string or bytes)."""
    n, tag = len(payload), field << 3 | LEN
    return (_SMALL[tag] if tag < 128 else varint(tag)) + (_SMALL[n] if n < 128 else varint(n)) + payload


def uint(field: int, value: int) -> bytes:
    """A VARINT field (an enum, a bool, an unsigned integer)."""
    tag = field << 3 | VARINT
    return (_SMALL[tag] if tag < 128 else varint(tag)) + varint(value)


def struct_bytes(obj: Mapping[str, Any]) -> bytes:
    """A ``google.protobuf.Struct``'s encoding, keys in sorted order (as protobuf's
    deterministic serialisation writes map entries)."""
    return b"".join(ld(1, ld(1, k.encode()) + ld(2, _value_bytes(obj[k]))) for k in sorted(obj))


def _value_bytes(v: Any) -> bytes:
    if v is None:
        return uint(1, 0)
    if isinstance(v, bool):
        return uint(4, int(v))
    if isinstance(v, int | float):
        return _SMALL[2 << 3 | FIXED64] + _DOUBLE.pack(float(v))
    if isinstance(v, str):
        return ld(3, v.encode())
    if isinstance(v, Mapping):
        return ld(5, struct_bytes(v))
    if isinstance(v, list | tuple):
        return ld(6, b"".join(ld(1, _value_bytes(x)) for x in v))
    raise TypeError(f"not a JSON-like value: {type(v).__name__}")
