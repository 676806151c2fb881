"""The overhead benchmark's null proxy relays the upstream's answers unchanged, one body or a
stream, so that what it costs is the floor of a proxy on specgate's stack."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import ModuleType

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.deploy.helpers import load_module

LOADTESTS = Path(__file__).resolve().parents[2] / "loadtests"
TIMEOUT_S = 10.0


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_module(LOADTESTS / "bench_overhead.py", "specgate_bench_overhead_np")


@pytest.fixture(scope="module")
def null_proxy() -> ModuleType:
    return load_module(LOADTESTS / "null_proxy.py", "specgate_null_proxy")


async def _post(session: aiohttp.ClientSession, url: str, stream: bool) -> tuple[int, str, bytes]:
    body = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    async with session.post(url + "/v1/chat/completions", data=body) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.read()


@pytest.mark.parametrize("stream", [False, True])
async def test_relays_the_upstreams_answer_unchanged(
    bench: ModuleType, null_proxy: ModuleType, tmp_path: Path, stream: bool
) -> None:
    upstream = TestServer(bench.upstream_app(3))
    await upstream.start_server()
    port_file = tmp_path / "port"
    listening = asyncio.Event()
    task = asyncio.create_task(null_proxy.serve(f"127.0.0.1:{upstream.port}", str(port_file), listening))
    try:
        async with asyncio.timeout(TIMEOUT_S), aiohttp.ClientSession() as session:
            await listening.wait()
            proxied = f"http://127.0.0.1:{port_file.read_text()}"
            direct = await _post(session, f"http://127.0.0.1:{upstream.port}", stream)
            relayed = await _post(session, proxied, stream)
            async with session.get(proxied + "/health") as health:
                assert health.status == 200
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await upstream.close()
    assert relayed[0] == direct[0] == 200
    assert relayed[1].startswith("text/event-stream" if stream else "application/json")
    assert relayed[2] == direct[2]
    if stream:
        assert relayed[2].count(b"data: ") == 4 and relayed[2].endswith(b"data: [DONE]\n\n")
