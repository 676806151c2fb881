"""An emulated engine pair plus the gateway, as real subprocesses on ephemeral ports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from specgate_lab.bench.procs import Proc, free_port, gateway_config, running_stack


@pytest.fixture
async def gateway_url(tmp_path: Path) -> AsyncIterator[str]:
    spec_port, base_port, gw_port = free_port(), free_port(), free_port()
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(gw_port, spec_port, base_port, "adaptive")))
    emu = Proc(
        "emulator",
        ["emulate", "--pair", "--spec-port", str(spec_port), "--base-port", str(base_port)],
        str(tmp_path / "emulator.log"),
    )
    gw = Proc("gateway", ["serve", "--config", str(cfg)], str(tmp_path / "gateway.log"))
    async with running_stack(emu, [gw], spec_port, base_port, [gw_port]) as urls:
        yield urls[0]
