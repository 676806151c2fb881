"""The log guard: no request bytes in any logger's line, warnings rate-limited with
"N similar messages suppressed" summaries (fake clock)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gateway.api.cli_serve import _JsonFormatter
from gateway.telemetry.logguard import LogGuard, safe_exception
from tests.fakes import FakeClock

SECRET = "sk-SECRET-guard-0042"
MARKER = "PROMPT-MARKER-guard"


@pytest.fixture
def out() -> Iterator[tuple[io.StringIO, LogGuard, FakeClock]]:
    """A root handler as ``specgate serve`` installs it, writing to a buffer."""
    clock = FakeClock(0.0)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    guard = LogGuard(5.0, clock=clock)
    handler.addFilter(guard)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield buf, guard, clock
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _raise_parse_error() -> None:
    raw = f"POST / HTTP/1.1\r\nAuthorization: Bearer {SECRET}\r\n\r\n{MARKER}".encode()
    raise ValueError(f"Invalid header value char: {raw!r}")


def test_no_logger_writes_exception_text_args_or_quoted_bytes(
    out: tuple[io.StringIO, LogGuard, FakeClock],
) -> None:
    buf, _, _ = out
    raw = f"Authorization: Bearer {SECRET}\r\n{MARKER}".encode()
    try:
        _raise_parse_error()
    except ValueError as exc:
        logging.getLogger("aiohttp.server").error("Error handling request from %s", "10.0.0.7", exc_info=exc)
        logging.getLogger("gateway.api.app").exception("unhandled error")
    logging.getLogger("aiohttp.server").warning("bad data %r from %s", raw, "::1")
    logging.getLogger("asyncio").error(f"Exception in callback cb({raw!r})\nhandle: <Handle {MARKER}>")
    logging.getLogger("opentelemetry.exporter").warning("export failed: %s", f"{MARKER} {SECRET}")
    logging.getLogger("aiohttp.access").info(f'127.0.0.1 "GET /x?key={SECRET} HTTP/1.1" 200')
    text = buf.getvalue()
    assert SECRET not in text and MARKER not in text, text
    lines = text.splitlines()
    assert "ERROR aiohttp.server: Error handling request from 10.0.0.7" in lines
    assert "ValueError" in lines  # the type, without its text; no frames for library records
    assert "WARNING aiohttp.server: bad data '…' from ::1" in lines
    assert "ERROR asyncio: Exception in callback cb('…')" in lines
    assert "WARNING opentelemetry.exporter: export failed: <str>" in lines
    assert "aiohttp.access" not in text  # dropped: the gateway writes its own access line
    # The gateway's own exception keeps its frames (code, not data) for debugging.
    assert "in _raise_parse_error" in text and "exception text withheld" in text


def test_json_lines_carry_the_safe_exception(out: tuple[io.StringIO, LogGuard, FakeClock]) -> None:
    buf, guard, _ = out
    (handler,) = [h for h in logging.getLogger().handlers if guard in h.filters]
    handler.setFormatter(_JsonFormatter())
    try:
        _raise_parse_error()
    except ValueError:
        logging.getLogger("aiohttp.web").exception("Error handling request")
    (line,) = buf.getvalue().splitlines()
    rec = json.loads(line)
    assert rec["exc"] == "ValueError" and SECRET not in line and MARKER not in line


def test_safe_exception_names_the_chain_without_text() -> None:
    try:
        try:
            raise KeyError(SECRET)
        except KeyError as inner:
            raise RuntimeError(MARKER) from inner
    except RuntimeError as exc:
        text = safe_exception(exc, frames=False)
    assert text == "KeyError\nRuntimeError"


def test_a_flood_is_one_line_then_a_summary(out: tuple[io.StringIO, LogGuard, FakeClock]) -> None:
    buf, guard, clock = out
    server = logging.getLogger("aiohttp.server")
    access = logging.getLogger("specgate.access")
    for i in range(400):
        clock.t = i * 0.00175  # 400 in 0.7 s
        server.error("Error handling request from %s", "10.0.0.7")
        access.info("event=request status=400")  # the access line is never rate-limited
    lines = buf.getvalue().splitlines()
    assert len([ln for ln in lines if "aiohttp.server" in ln]) == 1
    assert len([ln for ln in lines if "specgate.access" in ln]) == 400
    assert guard.flush() == 0  # the interval is not over yet
    clock.t = 5.0
    assert guard.flush() == 1
    assert guard.flush() == 0  # reported once
    summary = buf.getvalue().splitlines()[-1]
    assert summary == (
        "WARNING specgate.log: 399 similar messages suppressed in the last 5s: "
        "aiohttp.server: Error handling request from %s"
    )
    # The key's next line comes out after its interval, not before.
    server.error("Error handling request from %s", "10.0.0.7")
    clock.t = 10.0
    server.error("Error handling request from %s", "10.0.0.7")
    tail = buf.getvalue().splitlines()[-1]
    assert (
        tail
        == "ERROR aiohttp.server: Error handling request from 10.0.0.7 (1 similar suppressed in the last 5s)"
    )


def test_the_gateways_own_lines_are_keyed_by_their_short_arguments(
    out: tuple[io.StringIO, LogGuard, FakeClock],
) -> None:
    buf, _, _ = out
    log = logging.getLogger("gateway.api.app")
    for name in ("spec0", "base0", "spec0", "base0"):
        log.warning("engine %s is %s", name, "DOWN (health check)")
    assert buf.getvalue().splitlines() == [
        "WARNING gateway.api.app: engine spec0 is DOWN (health check)",
        "WARNING gateway.api.app: engine base0 is DOWN (health check)",
    ]
