"""`specgate --version` and `specgate serve --help` tell the truth about the install and the app."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from gateway.api.app import build_app
from gateway.cli import main
from gateway.config import load_config


def test_version_is_the_installed_packages(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"specgate {version('specgate')}"


def test_serve_help_names_every_endpoint_the_gateway_serves(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    app = build_app(load_config(None, env={}))
    endpoints = {
        (r.method, r.resource.canonical)
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    assert ("POST", "/admin/drain") in endpoints
    for method, path in sorted(endpoints):
        assert f"{method} {path}" in text, f"serve --help omits {method} {path}"


# -- the lab's commands: an entry point of specgate-lab, a hint without it ------------------
def test_the_lab_registers_its_commands_by_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import entry_points

    from gateway import cli

    (ep,) = [e for e in entry_points(group=cli.COMMAND_GROUP) if e.name == "lab"]
    table = ep.load()
    assert tuple(table) == cli.LAB_COMMANDS
    assert all(module.startswith("specgate_lab.") for module, _ in table.values())
    assert cli.plugin_commands() == table
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(f"    {name}" in out for name in (*cli.SUBCOMMANDS, *cli.LAB_COMMANDS))
    assert "Not installed" not in out


def test_without_the_lab_its_commands_say_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway import cli

    monkeypatch.setattr(cli, "plugin_commands", dict)
    assert main(["emulate", "--pair"]) == 2
    err = capsys.readouterr().err
    assert "'emulate' is a lab tool" in err and "pip install -e . -e ./lab" in err
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Not installed here" in out and "emulate" in out.split("Not installed here")[1]


def test_the_runtime_and_the_lab_are_released_together() -> None:
    import tomllib
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    runtime = tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lab = tomllib.loads((repo / "lab" / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert lab["version"] == runtime["version"]
    assert f"specgate=={runtime['version']}" in lab["dependencies"]
    assert runtime["optional-dependencies"]["lab"] == [f"specgate-lab=={lab['version']}"]
