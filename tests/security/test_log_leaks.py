"""A real ``specgate serve`` fed malformed HTTP (bare LF, invalid header characters, NUL,
oversized and too many headers, bad chunked framing, TLS/HTTP2 on the port ...), each
carrying a client key and a prompt marker: no log line holds either, every refusal is an
OpenAI-shaped JSON 400 that echoes no request bytes, and the refusals are rate-limited."""

from __future__ import annotations

import asyncio
import json
import math
import re
import signal
import socket
import sys
from pathlib import Path

import pytest
import yaml

from tests.reliability.rig import until
from tests.security.malformed import MARKER, SECRET_KEY, cases, send_raw

ROUNDS = 20


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(tmp: Path) -> Path:
    dead = f"http://127.0.0.1:{_closed_port()}"
    cfg = {
        "server": {"host": "127.0.0.1", "port": 0, "api_keys": [SECRET_KEY]},
        "scrape": {"enabled": False},
        "models": [
            {
                "name": "m1",
                "pairs": [
                    {
                        "spec": {
                            "name": "s",
                            "url": dead,
                            "served_model_name": "m1-spec",
                            "method": "ngram",
                            "k": 3,
                        },
                        "base": {"name": "b", "url": dead, "served_model_name": "m1-base"},
                    }
                ],
            }
        ],
    }
    path = tmp / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _check_refusal(name: str, raw: bytes) -> None:
    assert raw, f"{name}: no answer"
    head, _, body = raw.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 400 ", head), (name, head)
    assert b"application/json" in head, (name, head)
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert SECRET_KEY.encode() not in raw and MARKER.encode() not in raw, name


@pytest.mark.parametrize("log_json", [False, True], ids=["text", "json"])
async def test_malformed_http_never_puts_request_bytes_in_the_log(tmp_path: Path, log_json: bool) -> None:
    log_path = tmp_path / "gateway.log"
    args = ["-m", "gateway", "serve", "--config", str(_config(tmp_path)), "--log-level", "DEBUG"]
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *args, *(["--log-json"] if log_json else []), stderr=log_file
        )
    try:
        await until(lambda: b"listening on" in log_path.read_bytes(), 30, "gateway started")
        m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)", log_path.read_bytes())
        assert m
        port = int(m.group(1))
        loop = asyncio.get_running_loop()
        started = loop.time()
        malformed = {k: v for k, v in cases().items() if k != "short_body"}
        for name, data in malformed.items():
            _check_refusal(name, await asyncio.to_thread(send_raw, "127.0.0.1", port, data))
        for _ in range(ROUNDS - 1):
            for data in malformed.values():
                await asyncio.to_thread(send_raw, "127.0.0.1", port, data)
        elapsed = loop.time() - started
        # A body that never arrives, a body that is not JSON, a query string with the key,
        # and a well-formed request whose engines are down: all through the request path.
        await asyncio.to_thread(send_raw, "127.0.0.1", port, cases()["short_body"], 0.5)
        auth = f"Authorization: Bearer {SECRET_KEY}\r\n".encode()
        for body in (
            MARKER.encode() + b"{",
            json.dumps({"model": "m1", "messages": [{"role": "user", "content": MARKER}]}).encode(),
        ):
            req = (
                b"POST /v1/chat/completions?key="
                + SECRET_KEY.encode()
                + b" HTTP/1.1\r\nHost: gw\r\n"
                + auth
                + b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                % len(body)
                + body
            )
            raw = await asyncio.to_thread(send_raw, "127.0.0.1", port, req)
            assert raw.startswith((b"HTTP/1.1 400", b"HTTP/1.1 502", b"HTTP/1.1 503")), raw[:100]
            assert SECRET_KEY.encode() not in raw and MARKER.encode() not in raw
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = log_path.read_text()
    assert SECRET_KEY not in text and MARKER not in text
    assert "Traceback" not in text
    # Rate-limited: per 5 s window at most one line about malformed requests (the record
    # itself or its "N similar messages suppressed" summary), whatever the request count.
    refusals = [ln for ln in text.splitlines() if "malformed HTTP request" in ln]
    assert 1 <= len(refusals) <= math.ceil(elapsed / 5) + 2, refusals
    assert any("similar" in ln for ln in refusals), refusals  # the count is reported at exit
