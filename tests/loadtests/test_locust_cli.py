"""The Locust kit's command line: its options are listed with their env vars, and the
README's commands use options that exist (and include a short run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO / "loadtests" / "locustfile.py"
README = REPO / "loadtests" / "README.md"
LOCUST = Path(sys.executable).with_name("locust")


def _run(args: list[str]) -> str:
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def help_text() -> str:
    return _run([sys.executable, str(LOCUSTFILE), "--help"])


def _specgate_options(text: str) -> dict[str, str]:
    """--option -> its help, from the "specgate" group of a Locust help text."""
    section = text.split("\nspecgate:\n", 1)[1].split("\n\n", 2)[1]  # after the group's description
    out: dict[str, str] = {}
    for entry in re.split(r"\n(?=  --)", section.split("\n\n", 1)[0]):
        name, _, rest = entry.strip().partition(" ")
        out[name] = " ".join(rest.split())
    return out


def test_the_locustfile_help_lists_the_specgate_options_with_their_env_vars(help_text: str) -> None:
    assert "SPECGATE_LT_<NAME>" in help_text  # the group's description says how env vars are named
    opts = _specgate_options(help_text)
    assert {"--qps", "--pool", "--mix", "--temperature", "--specgate-requests-csv"} <= opts.keys()
    for name, text in opts.items():
        env = "SPECGATE_LT_" + name.removeprefix("--").removeprefix("specgate-").replace("-", "_").upper()
        assert f"(env {env})" in text, (name, text)
    assert "auto" in opts["--pool"] and "closed loop" in opts["--qps"]
    assert "--run-time" in help_text and "--headless" in help_text  # Locust's own options too


@pytest.mark.xfail(
    strict=True,
    reason="locust --help exits before it imports the locustfile (locust issue 2917), so custom "
    "options are missing; when this passes, Locust lists them: drop the README's workaround",
)
def test_locusts_own_help_lists_the_specgate_options() -> None:
    text = _run([str(LOCUST), "-f", str(LOCUSTFILE), "--help"])
    assert "--qps" in text and "--pool" in text


def _readme_locust_commands() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Locust", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = cmd.split("  #", 1)[0].strip()
            if cmd.startswith("locust "):
                commands.append(cmd)
    return commands


def test_the_readme_commands_use_existing_options_and_one_is_short(help_text: str) -> None:
    commands = _readme_locust_commands()
    assert len(commands) >= 2
    known = set(re.findall(r"(?<![\w-])(-{1,2}[a-zA-Z][\w-]*)", help_text))
    for cmd in commands:
        used = set(re.findall(r"(?<![\w-])(-{1,2}[a-zA-Z][\w-]*)", cmd))
        assert used <= known, (cmd, used - known)
    short = [c for c in commands if (m := re.search(r" -t (\d+)s\b", c)) and int(m.group(1)) <= 30]
    assert short and all("--headless" in c and "--qps" in c for c in short), commands
