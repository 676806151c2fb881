"""The container images, actually built and run: `deploy/image/build.sh` makes a Debian base
with mmdebstrap and builds the unmodified Dockerfile with buildah (no registry, no daemon),
once as the runtime image and once with the lab tools (`--lab`). Then two containers play
the compose stack's emulated profile: one of the lab image runs the emulated engine pair,
one of the runtime image the gateway as the image starts it (its ENTRYPOINT and
CMD, its default config with the engines moved to loopback ports by SPECGATE_* variables,
as the user it declares), and the real OpenAI SDK sends routed requests through.

Needs buildah and mmdebstrap (`make system-deps` installs both on Debian as root); skipped
without them, failed under CI=true. Costs about 40 s with a warm network: the base (~20 s),
the build (~15 s, wheels from PyPI) and the run (~5 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml
from openai import OpenAI

from tests.deploy.helpers import COMPOSE_DIR, REPO, interpolate, require_tool
from tests.deploy.test_stack_smoke import free_port, get

BUILD = REPO / "deploy" / "image" / "build.sh"
# Per run: two suites on one host (a developer's and CI's, or a second copy loading the
# machine) must not remove each other's image, and with it the containers running from it.
TAG = f"localhost/specgate:test-image-build-{os.getpid()}"
LAB_TAG = f"localhost/specgate-lab:test-image-build-{os.getpid()}"
BASE = "localhost/specgate-base:bookworm"


def _buildah(*args: str, timeout: float = 120) -> str:
    out = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, f"buildah {' '.join(args)} failed:\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def image() -> Iterator[dict[str, object]]:
    """Build the runtime image and the lab image (and their base, when missing); yield the
    runtime image's config; remove all after."""
    require_tool("buildah")
    require_tool("mmdebstrap")
    had_base = (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", BASE], capture_output=True, check=False
        ).returncode
        == 0
    )
    try:
        for args in (["-t", TAG], ["--lab", "-t", LAB_TAG]):
            build = subprocess.run([str(BUILD), *args], capture_output=True, text=True, timeout=900)
            log = f"{build.stdout[-2000:]}\n{build.stderr[-4000:]}"
            assert build.returncode == 0, f"image build ({' '.join(args)}) failed:\n{log}"
        yield json.loads(_buildah("inspect", "--type", "image", TAG))
    finally:
        # Clean-up is best effort and bounded: on a loaded host 'buildah rmi' of the base once
        # took past the test's time limit, failing a test whose checks had passed.
        for tag in (TAG, LAB_TAG):
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(["buildah", "rmi", "-f", tag], capture_output=True, check=False, timeout=30)
        if not had_base:
            # not forced: a second suite on this host may be building on the base right now
            # (seen: its build failed with 'layer not known'); buildah then refuses, and the
            # base stays as the cache it is
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(["buildah", "rmi", BASE], capture_output=True, check=False, timeout=30)


class Container:
    """One working container of the image running one command in the background, on the
    host network (buildah's chroot isolation), stopped as `docker stop` stops one: SIGTERM
    to the container's own process (buildah itself would answer SIGTERM with SIGKILL)."""

    def __init__(self, image: str, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self.ctr = _buildah("from", "--quiet", image).strip()
        env_args = [a for k, v in env.items() for a in ("--env", f"{k}={v}")]
        run = ["buildah", "run", "--isolation", "chroot", "--network", "host", *env_args, self.ctr]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*run, "--", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return f"--- {self.name}\n{self.log.read_text(errors='replace')[-3000:]}"

    def stop(self) -> int | None:
        code: int | None = None
        if self.proc.poll() is None:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
            inside = [p for p in tree if p.cmdline() and not p.cmdline()[0].startswith("buildah")]
            for p in inside[:1]:  # the outermost: the container's first process
                p.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        subprocess.run(["buildah", "rm", self.ctr], capture_output=True, check=False)
        return code


@pytest.mark.slow
@pytest.mark.timeout(
    1900
)  # its fixture builds two images (and the base, from Debian packages, when missing): up to 900 s each
def test_image_builds_and_routes_requests(image: dict[str, object], tmp_path: Path) -> None:
    docker = image["Docker"]
    assert isinstance(docker, dict)
    cfg = docker["config"]
    assert cfg["User"] == "10001:10001"
    assert cfg["Entrypoint"] == ["specgate"]
    assert cfg["Healthcheck"]["Test"][0] == "CMD"
    with (COMPOSE_DIR / "compose.yaml").open(encoding="utf-8") as f:
        services = interpolate(yaml.safe_load(f), {})["services"]
    spec_port, base_port, port = free_port(), free_port(), free_port()
    emu_cmd = [*services["emulator"]["command"], "--host=127.0.0.1"]
    emu_cmd += [f"--spec-port={spec_port}", f"--base-port={base_port}"]
    gw_env = {k: str(v) for k, v in services["gateway"]["environment"].items()}
    gw_env.update(
        SPECGATE_SERVER__HOST="127.0.0.1",
        SPECGATE_SERVER__PORT=str(port),
        SPECGATE_MODELS__0__PAIRS__0__SPEC__URL=f"http://127.0.0.1:{spec_port}",
        SPECGATE_MODELS__0__PAIRS__0__BASE__URL=f"http://127.0.0.1:{base_port}",
    )
    # The runtime image has no lab tools: asked for the emulator, it says how to get them.
    probe = Container(TAG, "probe", [*cfg["Entrypoint"], *emu_cmd], {}, tmp_path / "probe.log")
    assert probe.proc.wait(timeout=60) == 2 and "pip install" in probe.output(), probe.output()
    probe.stop()
    emulator = Container(LAB_TAG, "emulator", [*cfg["Entrypoint"], *emu_cmd], {}, tmp_path / "emulator.log")
    # The gateway exactly as the image starts it: ENTRYPOINT + CMD, its baked-in config.
    gateway = Container(TAG, "gateway", [*cfg["Entrypoint"], *cfg["Cmd"]], gw_env, tmp_path / "gateway.log")
    containers = [gateway, emulator]
    try:
        deadline = time.monotonic() + 60
        while get(f"http://127.0.0.1:{port}/ready")[0] != 200:
            for c in containers:
                assert c.proc.poll() is None, "a container exited early:\n" + c.output()
            logs = "\n".join(c.output() for c in containers)
            assert time.monotonic() < deadline, "gateway not ready:\n" + logs
            time.sleep(0.2)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=30)
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="qwen3-8b",
                messages=[{"role": "user", "content": "Return this unchanged:\n```\nx = 1\n```"}],
                temperature=0,
                max_tokens=16,
            )
            assert raw.headers["x-specgate-route"] in ("spec", "base")
            assert raw.headers["x-specgate-engine"] in ("spec0", "base0")
            assert raw.parse().choices[0].message.content
        finally:
            client.close()
        status, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "specgate_requests_total" in metrics
    finally:
        codes = [c.stop() for c in containers]
    assert codes == [0, 0], "\n".join(c.output() for c in containers)
