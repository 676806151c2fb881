"""`specgate serve` as users run it: a subprocess on an ephemeral port, SIGTERM to stop."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp
import yaml

from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness


async def test_serve_subprocess_proxies_and_stops_on_sigterm(tmp_path: Path) -> None:
    async with harness(spec=FakeEngine("m1-spec")) as h:
        from gateway.api.state import STATE

        engines = h.app[STATE].models["m1"].engines
        cfg = {
            "server": {"host": "127.0.0.1", "port": 0, "api_keys": ["serve-test-key"]},
            "scrape": {"enabled": False},
            "models": [
                {
                    "name": "m1",
                    # The temperature rule makes the expected route exact (T=0 -> spec).
                    "routing": {"policy": "temperature"},
                    "pairs": [
                        {
                            "spec": {
                                "name": "s",
                                "url": engines["spec0"].config.url,
                                "served_model_name": "m1-spec",
                                "method": "ngram",
                                "k": 3,
                            },
                            "base": {
                                "name": "b",
                                "url": engines["base0"].config.url,
                                "served_model_name": "m1-base",
                            },
                        }
                    ],
                }
            ],
        }
        path = tmp_path / "gw.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(path),
            "--log-level",
            "WARNING",
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stderr is not None
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            m = re.search(rb"listening on (http://\S+)", line)
            assert m, line
            url = m.group(1).decode()
            async with aiohttp.ClientSession() as s:
                async with s.get(url + "/health") as r:
                    assert r.status == 200
                body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
                headers = {"Authorization": "Bearer serve-test-key"}
                async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200
                    assert (await r.json())["model"] == "m1"
                    assert r.headers["x-specgate-route"] == "spec"
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert h.spec.requests[0].body["model"] == "m1-spec"
