"""The configuration reference (docs/config-reference.md, docs/config.schema.json) is
generated from the models, complete and current; `serve --check --explain` names each
setting's source."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from gateway import cli
from gateway.api import cli_serve
from gateway.config import GatewayConfig, cli_reference, explain, load_config, reference
from gateway.config.loader import load_config_with_origins

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_every_field_has_a_description() -> None:
    missing = reference.undescribed()
    assert not missing, f"fields without a description (give each Field a description=): {missing}"


def test_a_field_without_a_description_is_found() -> None:
    class Inner(BaseModel):
        ok: int = Field(1, description="described")
        bare_s: float = 1.0

    class Outer(BaseModel):
        inner: list[Inner] = Field(default_factory=list, description="items")
        other: Inner | None = None

    assert reference.undescribed(Outer) == ["inner[i].bare_s", "other", "other.bare_s"]


def test_committed_reference_is_current() -> None:
    for name, text in reference.files().items():
        path = DOCS / name
        assert path.is_file() and path.read_text(encoding="utf-8") == text, (
            f"docs/{name} is not what the config models generate: run `{reference.COMMAND}` "
            "(or `python -m gateway config-reference --out docs/`) and commit the result"
        )


def test_the_command_writes_the_files_and_its_check_finds_drift(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cli_reference.configure(parser)
    check = parser.parse_args(["--out", str(tmp_path), "--check"])
    assert cli_reference.main(check) == 1
    assert reference.COMMAND in capsys.readouterr().err
    assert cli.main(["config-reference", "--out", str(tmp_path)]) == 0  # through the dispatcher
    assert cli_reference.main(check) == 0
    schema = json.loads((tmp_path / reference.SCHEMA_FILE).read_text(encoding="utf-8"))
    assert schema["required"] == ["models"] and "server" in schema["properties"]
    (tmp_path / reference.MARKDOWN_FILE).write_text("stale\n", encoding="utf-8")
    assert cli_reference.main(check) == 1


def _rows() -> list[reference.Setting]:
    return [s for sec in reference.sections() for s in sec.settings]


def test_every_setting_has_a_row_with_type_default_and_variable() -> None:
    rows = {r.path: r for r in _rows()}
    page = reference.markdown()
    assert len(rows) > 100
    for r in rows.values():
        assert r.description and r.type and r.default and r.env.startswith("SPECGATE_")
        assert f"| `{r.path}` |" in page
    assert rows["scrape.interval_s"].unit == "seconds"
    assert rows["epp.limits.accepts_per_s"].unit == "per second"
    assert rows["epp.limits.stream_memory_bytes"].unit == "bytes"
    assert rows["epp.limits.slice_ms"].unit == "milliseconds"
    assert rows["server.port"].unit == ""
    assert rows["server.port"].type == "integer (≥ 0, ≤ 65535)"
    assert rows["epp.limits.ping.rate"].default == "10.0"  # the section's default object, not "required"
    assert rows["models[i].name"].default == "required"
    assert rows["models[i].routing.policy"].type.startswith('"adaptive" | ')
    assert rows["models[i].pairs[j].spec.k"].env == "SPECGATE_MODELS__<i>__PAIRS__<j>__SPEC__K"
    assert rows["server.api_keys"].env == "SPECGATE_SERVER__API_KEYS or SPECGATE_API_KEYS"


def _at(data: object, dotted: str) -> object:
    for part in dotted.split("."):
        if isinstance(data, list):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return None
    return data


def test_each_documented_variable_sets_its_setting() -> None:
    """Every variable of the table (index 0 for <i>/<j>), given the embedded default's value
    of its setting, is read (a wrong name would be an unknown field, an error) and is that
    setting's source."""
    default = load_config(None, env={}).model_dump(mode="json")
    checked = 0
    for r in _rows():
        dotted = r.path.replace("[i]", ".0").replace("[j]", ".0")
        value = _at(default, dotted)
        if value is None or value == {} or "secret" in r.type:
            continue  # unset in the embedded default (e.g. a model's discovery), an empty
            # mapping (it sets nothing: explain says "default", the same value), or masked
        var = r.env.split(" or ")[0].replace("<i>", "0").replace("<j>", "0")
        text = value if isinstance(value, str) else json.dumps(value)
        cfg, origins = load_config_with_origins(None, env={var: text})
        assert origins.of(dotted) == ("env", var), r.path
        assert _at(cfg.model_dump(mode="json"), dotted) == value, r.path
        checked += 1
    assert checked > 100


# ---- serve --check --explain ------------------------------------------------------------


def _explain(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    cli_serve.configure(parser)
    assert cli_serve.main(parser.parse_args([*args, "--check", "--explain"])) == 0
    out = capsys.readouterr().out
    lines = {}
    for line in out.splitlines():
        setting, _, source = line.partition("  # ")
        lines[setting.split(" = ")[0]] = source
    return lines


def test_explain_names_default_file_env_and_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(
        "server: {port: 9100, host: 10.1.1.1}\n"
        "models:\n"
        "  - name: m\n"
        "    pairs:\n"
        "      - spec: {name: s0, url: 'http://127.0.0.1:1', served_model_name: x, method: ngram, k: 4}\n"
        "        base: {name: b0, url: 'http://127.0.0.1:2', served_model_name: x}\n"
        "    routing: {prior_tokens_per_step: {eagle3: 2.5}}\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("SPECGATE_SERVER__HOST", "0.0.0.0")
    monkeypatch.setenv("SPECGATE_MODELS__0__TIMEOUTS__TOTAL_S", "30")
    monkeypatch.setenv("SPECGATE_API_KEYS", "very-secret-key-1")
    monkeypatch.setenv("SPECGATE_SERVER__MAX_CONCURRENCY", "99")
    src = _explain(["--config", str(cfg_file), "--max-concurrency", "3", "--policy", "always-spec"], capsys)
    assert src["server.port"] == f"file {cfg_file}"
    assert src["server.host"] == "environment SPECGATE_SERVER__HOST"  # env beats the file
    assert src["server.max_concurrency"] == "command line (--max-concurrency)"  # the flag beats env
    assert src["models[0].routing.policy"] == "command line (--policy)"
    assert src["models[0].timeouts.total_s"] == "environment SPECGATE_MODELS__0__TIMEOUTS__TOTAL_S"
    assert src["server.api_keys"] == "environment SPECGATE_API_KEYS"
    assert src["models[0].routing.prior_tokens_per_step"] == f"file {cfg_file}"
    assert src["models[0].pairs[0].spec.k"] == f"file {cfg_file}"
    assert src["scrape.interval_s"] == "default"
    assert src["epp.limits.ping.rate"] == "default"
    cfg = load_config(cfg_file)
    assert len(src) == len(list(explain.settings(cfg, cfg.model_dump(mode="json"))))


def test_explain_masks_secrets_and_names_the_embedded_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPECGATE_CONFIG", raising=False)
    monkeypatch.setenv("SPECGATE_ADMIN_KEYS", "admin-secret-key-1")
    parser = argparse.ArgumentParser()
    cli_serve.configure(parser)
    assert cli_serve.main(parser.parse_args(["--explain"])) == 0
    out = capsys.readouterr().out
    assert "admin-secret-key-1" not in out and '["**********"]' in out
    assert 'models[0].name = "qwen3-8b"' in out and "# embedded default config" in out


def test_a_whole_list_from_env_is_the_source_of_every_setting_below_it() -> None:
    models = (
        '[{"name": "m", "pairs": [{"base": {"name": "b", "url": "http://127.0.0.1:2", '
        '"served_model_name": "x"}}]}]'
    )
    cfg, origins = load_config_with_origins(None, env={"SPECGATE_MODELS": models})
    assert isinstance(cfg, GatewayConfig)
    assert origins.of("models.0.pairs.0.base.url") == ("env", "SPECGATE_MODELS")
    # the file's list was replaced whole: what the variable's items leave out is the default
    assert origins.of("models.0.timeouts.connect_s") == ("default", "")
    assert origins.of("models.0.name") == ("env", "SPECGATE_MODELS")
    assert origins.of("server.port") == ("file", "<embedded default.yaml>")


@pytest.mark.parametrize(
    "config",
    [
        "gateway/config/default.yaml",
        "deploy/compose/gateway.yaml",
        "deploy/k8s/base/gateway.yaml",
        "deploy/examples/plain-engine.yaml",
    ],
)
def test_the_shipped_configs_validate_against_the_json_schema(config: str) -> None:
    """The schema works for editors and linters: the shipped files pass it, a typo does not."""
    import jsonschema
    import yaml

    schema = json.loads((DOCS / reference.SCHEMA_FILE).read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    data = yaml.safe_load((ROOT / config).read_text(encoding="utf-8"))
    assert list(validator.iter_errors(data)) == []
    data.setdefault("server", {})["prot"] = 8000
    assert [e.validator for e in validator.iter_errors(data)] == ["additionalProperties"]
