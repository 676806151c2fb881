"""The GPU-free compose profile, run without Docker: the emulator and the gateway are
started as processes with exactly the command lines and configuration the compose file
gives them (only listen addresses and ports moved to free loopback ones), then the real
OpenAI SDK talks to the gateway, and both stop cleanly on SIGTERM as `docker stop` asks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from openai import OpenAI

from tests.deploy.helpers import COMPOSE_DIR, REPO, interpolate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError):
        return 0, ""


class Stack:
    def __init__(self, tmp: Path) -> None:
        with (COMPOSE_DIR / "compose.yaml").open(encoding="utf-8") as f:
            services = interpolate(yaml.safe_load(f), {})["services"]
        emu, gw = services["emulator"], services["gateway"]
        self.spec_port, self.base_port, self.port = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self._start(
            "emulator",
            [
                *emu["command"],
                "--host=127.0.0.1",
                f"--spec-port={self.spec_port}",
                f"--base-port={self.base_port}",
            ],
            {},
            tmp,
        )
        # The gateway's compose command, its mounted config and its environment; the engines'
        # compose names are moved to the loopback ports above through SPECGATE_* variables.
        argv = list(gw["command"])
        config_mount = next(v for v in gw["volumes"] if v.endswith(":/etc/specgate/config.yaml:ro"))
        argv[argv.index("--config") + 1] = str((COMPOSE_DIR / config_mount.split(":")[0]).resolve())
        env = {k: str(v) for k, v in gw["environment"].items()}
        env.update(
            SPECGATE_SERVER__HOST="127.0.0.1",
            SPECGATE_SERVER__PORT=str(self.port),
            SPECGATE_MODELS__0__PAIRS__0__SPEC__URL=f"http://127.0.0.1:{self.spec_port}",
            SPECGATE_MODELS__0__PAIRS__0__BASE__URL=f"http://127.0.0.1:{self.base_port}",
        )
        self._start("gateway", argv, env, tmp)

    def _start(self, name: str, argv: list[str], env: dict[str, str], tmp: Path) -> None:
        log = tmp / f"{name}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gateway", *argv],
                    cwd=REPO,
                    env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )

    def output(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                assert p.poll() is None, f"a process exited early:\n{self.output()}"
            status, _ = get(f"http://127.0.0.1:{self.port}/ready")
            if status == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"gateway not ready after {timeout_s}s:\n{self.output()}")

    def stop(self) -> list[int | None]:
        codes: list[int | None] = []
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                codes.append(p.wait(timeout=30))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path)
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.slow
def test_emulated_profile_serves_openai_clients_and_stops_cleanly(stack: Stack) -> None:
    stack.wait_ready()
    client = OpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key="unused", max_retries=0, timeout=30)
    try:
        models = [m.id for m in client.models.list()]
        assert models == ["qwen3-8b"]
        raw = client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=[
                {"role": "user", "content": "Rename x to y and return the code unchanged:\n```\nx = 1\n```"}
            ],
            temperature=0,
            max_tokens=16,
        )
        assert raw.headers["x-specgate-route"] in ("spec", "base")
        assert raw.headers["x-specgate-reason"]
        reply = raw.parse()
        assert reply.model == "qwen3-8b" and reply.choices[0].message.content
        # A request the speculative engine would refuse goes to the plain one.
        raw = client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            extra_body={"min_p": 0.1},
        )
        assert raw.headers["x-specgate-route"] == "base"
        chunks = list(
            client.chat.completions.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
            )
        )
        assert chunks and any(c.choices and c.choices[0].finish_reason for c in chunks)
    finally:
        client.close()
    status, metrics = get(f"http://127.0.0.1:{stack.port}/metrics")
    assert status == 200 and "specgate_requests_total" in metrics
    # Both engines' /metrics carry what the Prometheus config of the stack scrapes.
    _, spec_metrics = get(f"http://127.0.0.1:{stack.spec_port}/metrics")
    assert "vllm:spec_decode_num_drafts_total" in spec_metrics
    _, base_metrics = get(f"http://127.0.0.1:{stack.base_port}/metrics")
    assert "vllm:num_requests_running" in base_metrics
    assert "vllm:spec_decode_num_drafts_total" not in base_metrics
    # `docker stop` sends SIGTERM: both exit on their own, with status 0.
    assert stack.stop() == [0, 0], stack.output()
