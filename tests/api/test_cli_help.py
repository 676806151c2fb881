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
