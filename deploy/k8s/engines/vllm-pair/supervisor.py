#!/usr/bin/env python3
"""pair-supervisor: run a model's plain and speculative vLLM engines in ONE container.

Why one container: the NVIDIA device plugin hands a GPU to exactly one container, so two
containers (or two pods) cannot share it unless the cluster enables GPU time-slicing.
specgate's engine pair must share one GPU (both engines on one device timeline), so this
script runs both `vllm serve` processes side by side in a single container that holds the
GPU, and behaves like a good PID 1:

* starts the plain engine first and the speculative one only once the first answers
  /health — two vLLM processes profiling GPU memory at the same moment misjudge what is
  free, so a staggered start is the reliable one;
* if either engine exits, stops the other and exits non-zero, so the kubelet restarts
  the pair as a unit (a pair with one engine is not what the gateway was told about);
* forwards SIGTERM/SIGINT to both engines, waits up to --grace-s, then SIGKILLs;
* reaps orphaned grandchildren (it is PID 1 in the container).

Standard library only: it runs inside the official vllm/vllm-openai image.
Every flag has an environment variable, so a Kubernetes manifest sets env, not args.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

LOG_PREFIX = "[pair-supervisor]"


def log(msg: str) -> None:
    print(f"{LOG_PREFIX} {msg}", file=sys.stderr, flush=True)


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="supervisor.py",
        description="Run a plain and a speculative `vllm serve` on one GPU as one unit "
        "(plain first, speculative once the plain one is healthy). Every flag defaults to "
        "the environment variable named in its help.",
    )
    p.add_argument("--model", default=_env("MODEL", ""), help="model to serve (HF id or path) [MODEL]")
    p.add_argument(
        "--spec-config",
        default=_env("SPEC_CONFIG", ""),
        help="JSON given to the speculative engine's --speculative-config [SPEC_CONFIG]",
    )
    p.add_argument("--spec-port", type=int, default=int(_env("SPEC_PORT", "8001")), help="[SPEC_PORT]")
    p.add_argument("--base-port", type=int, default=int(_env("BASE_PORT", "8002")), help="[BASE_PORT]")
    p.add_argument(
        "--spec-served-model-name",
        default=_env("SPEC_SERVED_MODEL_NAME", ""),
        help="served name of the speculative engine [SPEC_SERVED_MODEL_NAME]",
    )
    p.add_argument(
        "--base-served-model-name",
        default=_env("BASE_SERVED_MODEL_NAME", ""),
        help="served name of the plain engine [BASE_SERVED_MODEL_NAME]",
    )
    p.add_argument(
        "--gpu-memory-utilization",
        default=_env("GPU_MEMORY_UTILIZATION", "0.45"),
        help="each engine's share of GPU memory; the two must sum below 1 [GPU_MEMORY_UTILIZATION]",
    )
    p.add_argument("--engine-args", default=_env("ENGINE_ARGS", ""), help="extra args for both [ENGINE_ARGS]")
    p.add_argument("--spec-args", default=_env("SPEC_ARGS", ""), help="extra args, spec engine [SPEC_ARGS]")
    p.add_argument("--base-args", default=_env("BASE_ARGS", ""), help="extra args, plain engine [BASE_ARGS]")
    p.add_argument(
        "--engine-bin", default=_env("ENGINE_BIN", "vllm"), help="the vLLM command line tool [ENGINE_BIN]"
    )
    p.add_argument(
        "--startup-timeout-s",
        type=float,
        default=float(_env("STARTUP_TIMEOUT_S", "1200")),
        help="time the first engine has to answer /health [STARTUP_TIMEOUT_S]",
    )
    p.add_argument(
        "--poll-interval-s",
        type=float,
        default=float(_env("POLL_INTERVAL_S", "2")),
        help="how often to poll /health during start-up [POLL_INTERVAL_S]",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=float(_env("GRACE_S", "30")),
        help="on shutdown, time the engines get before SIGKILL [GRACE_S]",
    )
    return p


def engine_argv(args: argparse.Namespace, role: str) -> list[str]:
    """The `vllm serve` command line of one engine of the pair."""
    port = args.spec_port if role == "spec" else args.base_port
    served = args.spec_served_model_name if role == "spec" else args.base_served_model_name
    argv = [*shlex.split(args.engine_bin), "serve", args.model, "--host", "0.0.0.0", "--port", str(port)]
    if served:
        argv += ["--served-model-name", served]
    argv += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if role == "spec":
        argv += ["--speculative-config", args.spec_config]
    argv += shlex.split(args.engine_args)
    argv += shlex.split(args.spec_args if role == "spec" else args.base_args)
    return argv


def validate(args: argparse.Namespace) -> str | None:
    """An error message, or None when the settings can start a pair."""
    if not args.model:
        return "no model: set MODEL or --model"
    if not args.spec_config:
        return "no speculative config: set SPEC_CONFIG or --spec-config (JSON)"
    try:
        spec = json.loads(args.spec_config)
    except json.JSONDecodeError as e:
        return f"SPEC_CONFIG is not valid JSON: {e}"
    if not isinstance(spec, dict) or "method" not in spec:
        return 'SPEC_CONFIG must be a JSON object with a "method", e.g. {"method": "ngram", ...}'
    if args.spec_port == args.base_port:
        return "the two engines need different ports"
    try:
        share = float(args.gpu_memory_utilization)
    except ValueError:
        return f"GPU_MEMORY_UTILIZATION must be a number, got {args.gpu_memory_utilization!r}"
    if not 0.0 < share < 0.5:
        return f"GPU_MEMORY_UTILIZATION is per engine and two share the GPU: need 0 < u < 0.5, got {share}"
    for extra in (args.engine_args, args.spec_args, args.base_args):
        if "--disable-log-stats" in shlex.split(extra):
            return "--disable-log-stats removes the vllm:* metrics the gateway routes on; drop it"
    return None


@dataclass
class Pair:
    grace_s: float
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)
    stopping: bool = False

    def start(self, role: str, argv: list[str]) -> None:
        log(f"starting {role} engine: {shlex.join(argv)}")
        # Each engine in its own process group (pgid = its pid), so that signals reach its
        # worker processes too, even after the API server itself has died: a vLLM engine
        # core orphaned that way would keep its share of the GPU memory.
        self.children[role] = subprocess.Popen(argv, start_new_session=True)

    def reap(self) -> None:
        """Collect every exited child: our engines (recording their codes) and orphans."""
        by_pid = {p.pid: role for role, p in self.children.items()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            role = by_pid.get(pid)
            if role is not None and role not in self.exit_codes:
                code = os.waitstatus_to_exitcode(status)
                self.exit_codes[role] = code
                self.children[role].returncode = code
                log(f"{role} engine exited with code {code}")

    def first_exit(self) -> tuple[str, int] | None:
        for role, code in self.exit_codes.items():
            return role, code
        return None

    def _leaders_running(self) -> bool:
        return len(self.exit_codes) < len(self.children)

    def _groups_alive(self) -> list[str]:
        alive = []
        for role, proc in self.children.items():
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                continue
            alive.append(role)
        return alive

    def _signal(self, sig: int, *, groups: bool) -> None:
        for role, proc in self.children.items():
            try:
                if groups:
                    os.killpg(proc.pid, sig)
                elif role not in self.exit_codes:
                    proc.send_signal(sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _wait(self, done: Callable[[], bool], until: float) -> bool:
        while time.monotonic() < until:
            self.reap()
            if done():
                return True
            time.sleep(0.05)
        self.reap()
        return done()

    def stop(self) -> None:
        """Stop both engines and everything they started.

        SIGTERM to each running engine (vLLM then shuts its own workers down), then
        SIGTERM to whatever is left in the engines' process groups (workers whose API
        server died), all within the grace period; SIGKILL to what still remains.
        """
        deadline = time.monotonic() + self.grace_s
        self._signal(signal.SIGTERM, groups=False)
        self._wait(lambda: not self._leaders_running(), deadline)
        if self._groups_alive():
            self._signal(signal.SIGTERM, groups=True)
        if self._wait(lambda: not self._leaders_running() and not self._groups_alive(), deadline):
            return
        log(f"engine processes still running after {self.grace_s:.0f}s: SIGKILL")
        self._signal(signal.SIGKILL, groups=True)
        self._signal(signal.SIGKILL, groups=False)
        self._wait(lambda: not self._leaders_running() and not self._groups_alive(), time.monotonic() + 10)


def healthy(port: int, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout_s) as r:
            return 200 <= int(r.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run(args: argparse.Namespace) -> int:
    pair = Pair(grace_s=args.grace_s)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not pair.stopping:
            log(f"received {signal.Signals(signum).name}: stopping both engines")
        pair.stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    pair.start("base", engine_argv(args, "base"))
    deadline = time.monotonic() + args.startup_timeout_s
    while not pair.stopping:
        pair.reap()
        if pair.first_exit() is not None:
            break
        if healthy(args.base_port):
            log(f"base engine healthy on :{args.base_port}")
            pair.start("spec", engine_argv(args, "spec"))
            break
        if time.monotonic() > deadline:
            log(f"base engine not healthy after {args.startup_timeout_s:.0f}s: giving up")
            pair.stop()
            return 1
        time.sleep(args.poll_interval_s)

    while not pair.stopping and pair.first_exit() is None:
        pair.reap()
        time.sleep(0.1)

    first = pair.first_exit()
    pair.stop()
    if first is None:  # asked to stop, no engine had failed
        log("both engines stopped")
        return 0
    role, code = first
    log(f"{role} engine stopped first (code {code}): the pair stops as a unit")
    if code < 0:  # killed by a signal: report it the way a shell does
        return 128 - code
    return code if code != 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    error = validate(args)
    if error is not None:
        log(f"error: {error}")
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
