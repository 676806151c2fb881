"""The Kubernetes engine pair's supervisor, run for real against a fake `vllm` command."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helpers import K8S, load_module

SUPERVISOR = K8S / "engines" / "vllm-pair" / "supervisor.py"
FAKE_VLLM = Path(__file__).with_name("fake_vllm.py")
NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2,"prompt_lookup_max":5}'

sup = load_module(SUPERVISOR, "pair_supervisor")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(*argv: str) -> Any:
    return sup.build_parser().parse_args(["--model", "m", "--spec-config", NGRAM, *argv])


# ---- command lines and validation (pure) ----------------------------------------------


def test_engine_command_lines() -> None:
    args = parse(
        "--spec-served-model-name",
        "m-spec",
        "--base-served-model-name",
        "m-base",
        "--engine-args",
        "--max-model-len 4096",
        "--spec-args",
        "--max-num-seqs 64",
    )
    spec, base = sup.engine_argv(args, "spec"), sup.engine_argv(args, "base")
    assert spec[:3] == ["vllm", "serve", "m"] and base[:3] == ["vllm", "serve", "m"]
    assert spec[spec.index("--port") + 1] == "8001" and base[base.index("--port") + 1] == "8002"
    assert spec[spec.index("--served-model-name") + 1] == "m-spec"
    assert base[base.index("--served-model-name") + 1] == "m-base"
    assert json.loads(spec[spec.index("--speculative-config") + 1])["method"] == "ngram"
    assert "--speculative-config" not in base
    for cmd in (spec, base):
        assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.45"
        assert cmd[cmd.index("--max-model-len") + 1] == "4096"
    assert "--max-num-seqs" in spec and "--max-num-seqs" not in base


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model", ""], "no model"),
        (["--spec-config", "{"], "not valid JSON"),
        (["--spec-config", '{"num_speculative_tokens": 5}'], '"method"'),
        (["--spec-port", "9000", "--base-port", "9000"], "different ports"),
        (["--gpu-memory-utilization", "0.9"], "0 < u < 0.5"),
        (["--gpu-memory-utilization", "lots"], "must be a number"),
        (["--engine-args=--disable-log-stats"], "disable-log-stats"),
    ],
)
def test_validation_rejects(argv: list[str], fragment: str) -> None:
    error = sup.validate(parse(*argv))
    assert error is not None and fragment in error


def test_validation_accepts_defaults() -> None:
    assert sup.validate(parse()) is None


# ---- the supervisor as a process --------------------------------------------------------


class Run:
    def __init__(self, tmp_path: Path, env: dict[str, str] | None = None) -> None:
        self.log = tmp_path / "engines.jsonl"
        self.spec_port, self.base_port = free_port(), free_port()
        argv = [
            sys.executable,
            str(SUPERVISOR),
            "--model",
            "m",
            "--spec-config",
            NGRAM,
            "--spec-port",
            str(self.spec_port),
            "--base-port",
            str(self.base_port),
            "--engine-bin",
            f"{sys.executable} {FAKE_VLLM}",
            "--poll-interval-s",
            "0.05",
            "--startup-timeout-s",
            "20",
            "--grace-s",
            "1",
        ]
        self.proc = subprocess.Popen(
            argv,
            env={"FAKE_VLLM_LOG": str(self.log), "PATH": "/usr/bin:/bin", **(env or {})},
            stderr=subprocess.PIPE,
            text=True,
        )

    def events(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def wait_for(self, role: str, event: str, timeout_s: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.events():
                if e["role"] == role and e["event"] == event:
                    return e
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"no {role}/{event}; events: {self.events()}; stderr: {self.stderr()}")

    def finish(self, timeout_s: float = 20.0) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(running)"
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        for e in self.events():  # never leave a fake engine behind
            if e["event"] == "started":
                try:
                    os.kill(e["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def run(tmp_path: Path) -> Any:
    runs: list[Run] = []

    def start(env: dict[str, str] | None = None) -> Run:
        r = Run(tmp_path, env)
        runs.append(r)
        return r

    yield start
    for r in runs:
        r.close()


def test_spec_engine_starts_only_after_base_is_healthy(run: Any) -> None:
    r = run({"FAKE_VLLM_BASE_HEALTH_DELAY_S": "0.5"})
    base = r.wait_for("base", "started")
    assert "--speculative-config" not in base["argv"]
    spec = r.wait_for("spec", "started")
    events = r.events()
    assert [e["role"] for e in events if e["event"] == "started"] == ["base", "spec"]
    assert spec["argv"][spec["argv"].index("--speculative-config") + 1] == NGRAM
    # By the time spec started, base had answered /health: the supervisor waited for it.
    assert sup.healthy(r.base_port)
    r.proc.send_signal(signal.SIGTERM)
    assert r.finish() == 0
    signalled = {e["role"] for e in r.events() if e["event"] == "signal"}
    assert signalled == {"base", "spec"}


def test_one_engine_dying_stops_the_pair_with_its_code(run: Any) -> None:
    r = run({"FAKE_VLLM_SPEC_EXIT": "0.3:3"})
    r.wait_for("spec", "exit")
    assert r.finish() == 3
    base_signal = r.wait_for("base", "signal")
    assert base_signal["signal"] == signal.SIGTERM
    assert "spec engine stopped first (code 3)" in r.stderr()


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie waiting for init
    except FileNotFoundError:
        return True


def test_killed_engine_leaves_no_orphaned_workers(run: Any) -> None:
    """Seen on a real H200: SIGKILL on a vLLM API server orphans its engine core, which keeps
    its GPU memory. The supervisor kills the engine's whole process group."""
    r = run({"FAKE_VLLM_SPEC_CORE": "1", "FAKE_VLLM_BASE_CORE": "1"})
    spec = r.wait_for("spec", "started")
    cores = [r.wait_for("spec", "core")["core_pid"], r.wait_for("base", "core")["core_pid"]]
    os.kill(spec["pid"], signal.SIGKILL)
    assert r.finish() == 128 + signal.SIGKILL
    deadline = time.monotonic() + 10
    while not all(_dead(pid) for pid in cores) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_dead(pid) for pid in cores), "engine worker processes outlived the pair"


def test_base_dying_during_startup_never_starts_spec(run: Any) -> None:
    r = run({"FAKE_VLLM_BASE_HEALTH_DELAY_S": "60", "FAKE_VLLM_BASE_EXIT": "0.2:7"})
    assert r.finish() == 7
    assert [e["role"] for e in r.events() if e["event"] == "started"] == ["base"]


def test_engine_ignoring_sigterm_is_killed_after_grace(run: Any) -> None:
    r = run({"FAKE_VLLM_BASE_IGNORE_TERM": "1"})
    r.wait_for("spec", "started")
    t0 = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    assert r.finish() == 0
    assert time.monotonic() - t0 >= 0.9  # waited the 1 s grace, then SIGKILL
    assert "SIGKILL" in r.stderr()


def test_bad_settings_exit_2_without_starting_anything(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--model", "m", "--spec-config", "not json"],
        capture_output=True,
        text=True,
        timeout=20,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "SPEC_CONFIG is not valid JSON" in proc.stderr


@pytest.mark.slow
def test_pair_smoke_script_against_fake_engines(tmp_path: Path) -> None:
    """deploy/k8s/tools/pair-smoke.sh (the GPU-host check) runs end to end on fake engines."""
    script = K8S / "tools" / "pair-smoke.sh"
    env = {
        "PATH": "/usr/bin:/bin",
        "ENGINE_BIN": f"{sys.executable} {FAKE_VLLM}",
        "FAKE_VLLM_LOG": str(tmp_path / "engines.jsonl"),
        "FAKE_VLLM_SPEC_CORE": "1",
        "SPEC_PORT": str(free_port()),
        "BASE_PORT": str(free_port()),
        "POLL_S": "0.1",
        "SETTLE_S": "0.2",
        "GRACE_S": "5",
        "LOGDIR": str(tmp_path),
    }
    proc = subprocess.run(
        ["bash", str(script), "--crash", "some/model", "--max-model-len", "4096"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("both engines healthy") == 2, out
    assert "pair-spec: 16 requests" in out and "pair-base: 16 requests" in out
    assert "SIGTERM: supervisor exit code 0" in out
    assert "spec engine SIGKILLed: supervisor exit code 137" in out
    assert "pair smoke check passed" in out
    started = [json.loads(x) for x in (tmp_path / "engines.jsonl").read_text().splitlines()]
    argv = next(e["argv"] for e in started if e["event"] == "started")
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    cores = [e["core_pid"] for e in started if e["event"] == "core"]
    assert len(cores) == 2 and all(_dead(pid) for pid in cores)
