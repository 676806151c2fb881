"""Malformed HTTP/1.1 requests, each carrying a secret key and a prompt marker, sent on raw
sockets: what a log or an error body must never echo back."""

from __future__ import annotations

import socket

SECRET_KEY = "sk-SECRET-KEY-7f3a9c1e5b"
MARKER = "PROMPT-MARKER-q8z7x6"
_BODY = (
    '{"model":"m1","messages":[{"role":"user","content":"' + MARKER + " " + "lorem ipsum " * 250 + '"}]}'
).encode()
_AUTH = b"Authorization: Bearer " + SECRET_KEY.encode()
_HEAD = b"POST /v1/chat/completions HTTP/1.1"


def _req(head_lines: list[bytes], body: bytes = _BODY, eol: bytes = b"\r\n") -> bytes:
    return eol.join(head_lines) + eol + eol + body


def cases() -> dict[str, bytes]:
    """Name -> raw bytes of one request the HTTP parser must refuse (or the body reader)."""
    cl = b"Content-Length: %d" % len(_BODY)
    m = MARKER.encode()
    return {
        "bare_lf": _req([_HEAD, b"Host: gw", _AUTH, cl], eol=b"\n"),
        "invalid_header_char": _req([_HEAD, b"Host: gw", _AUTH, b"X-Bad: a\x01" + m, cl]),
        "invalid_header_name": _req([_HEAD, b"Host: gw", _AUTH, b"X Bad" + m + b": v", cl]),
        "nul_in_value": _req([_HEAD, b"Host: gw", _AUTH + b"\x00" + m, cl]),
        "nul_in_request_line": _req([b"POST /v1/chat/\x00" + m + b" HTTP/1.1", b"Host: gw", _AUTH, cl]),
        "oversized_header": _req([_HEAD, b"Host: gw", _AUTH, b"X-Big: " + m * 1000, cl]),
        "oversized_request_line": _req([b"POST /" + m * 1000 + b" HTTP/1.1", b"Host: gw", _AUTH, cl]),
        "too_many_headers": _req(
            [_HEAD, b"Host: gw", _AUTH, *(b"X-H%d: %s" % (i, m) for i in range(200)), cl]
        ),
        "bad_chunked": _req(
            [_HEAD, b"Host: gw", _AUTH, b"Transfer-Encoding: chunked"], b"zz\r\n" + _BODY + b"\r\n0\r\n\r\n"
        ),
        "chunked_and_length": _req([_HEAD, b"Host: gw", _AUTH, b"Transfer-Encoding: chunked", cl]),
        "bad_content_length": _req([_HEAD, b"Host: gw", _AUTH, b"Content-Length: 1" + m]),
        "no_colon": _req([_HEAD, b"Host: gw", _AUTH, b"Authorization Bearer " + SECRET_KEY.encode() + m, cl]),
        "obs_fold": _req([_HEAD, b"Host: gw", _AUTH, b"X-Fold: a", b" " + m, cl]),
        "bad_method": _req([b"P\x7fST /v1/chat/completions HTTP/1.1", b"Host: gw", _AUTH, cl]),
        "garbage_line": _req([m + b" " + SECRET_KEY.encode(), _AUTH, cl]),
        "bad_version": _req([b"POST /v1/chat/completions HTTP/9." + m, b"Host: gw", _AUTH, cl]),
        "tls_hello": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + m + _AUTH,
        "h2_preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _AUTH + m,
        "short_body": _req([_HEAD, b"Host: gw", _AUTH, b"Content-Length: 999999"]),
    }


def send_raw(host: str, port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` and read the answer until the server closes the connection, or
    ``timeout`` seconds of silence (a request the server still waits on)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except OSError:
            pass
        return out
