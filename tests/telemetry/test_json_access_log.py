"""`specgate serve --log-json`: an access line's fields are JSON keys, not a string in msg."""

from __future__ import annotations

import json
import logging

from gateway.api.cli_serve import _JsonFormatter
from gateway.telemetry.logs import ACCESS_LOGGER, emit


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_access_fields_become_json_keys() -> None:
    log = logging.getLogger(ACCESS_LOGGER)
    cap = _Capture()
    log.addHandler(cap)
    old = log.level
    log.setLevel(logging.INFO)
    try:
        emit(
            {"model": "m1", "route": "spec", "reason": "predicted_faster", "status": 200, "ttft_ms": None},
            "json",
        )
    finally:
        log.removeHandler(cap)
        log.setLevel(old)
    (record,) = cap.records
    out = json.loads(_JsonFormatter().format(record))
    assert out["route"] == "spec" and out["reason"] == "predicted_faster" and out["status"] == 200
    assert "msg" not in out and "ttft_ms" not in out
    assert out["logger"] == ACCESS_LOGGER and out["level"] == "INFO"


def test_other_records_keep_msg() -> None:
    record = logging.LogRecord("specgate.x", logging.WARNING, __file__, 1, "engine %s down", ("spec0",), None)
    out = json.loads(_JsonFormatter().format(record))
    assert out["msg"] == "engine spec0 down"
