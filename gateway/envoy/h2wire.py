"""HTTP/2's wire for the EPP's gRPC server: frame types, flags, error and settings codes,
gRPC status codes, and how a frame is written (RFC 9113 §4, §6, §7; gRPC over HTTP/2)."""

from __future__ import annotations

import struct

from gateway.envoy.hpack_cache import STATUS_200, literal

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# error codes (RFC 9113 §7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 0x1, 0x2, 0x3, 0x4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x5, 0x6

# gRPC status codes used here
GRPC_OK, GRPC_CANCELLED, GRPC_INVALID_ARGUMENT, GRPC_DEADLINE_EXCEEDED = 0, 1, 3, 4
GRPC_RESOURCE_EXHAUSTED, GRPC_UNIMPLEMENTED, GRPC_INTERNAL, GRPC_UNAVAILABLE = 8, 12, 13, 14

MAX_WINDOW = (1 << 31) - 1
HEADER_BLOCK_MAX = 64 * 1024
DEFAULT_FRAME_SIZE = 16_384

_U32 = struct.Struct(">I")

_RESPONSE_HEADERS = STATUS_200 + literal("content-type", "application/grpc")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags)) + _U32.pack(stream_id) + payload


def _settings_payload(pairs: dict[int, int]) -> bytes:
    return b"".join(struct.pack(">HI", k, v) for k, v in pairs.items())


class ConnectionError_(Exception):
    """A connection error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code
