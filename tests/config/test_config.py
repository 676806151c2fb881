"""Configuration: embedded default, YAML errors naming file/field/problem, env and CLI overrides."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.api import cli_serve
from gateway.config import ConfigError, GatewayConfig, TelemetryConfig, default_config_text, load_config


def _write(tmp_path: Path, data: object, name: str = "gw.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _minimal() -> dict[str, object]:
    return yaml.safe_load(default_config_text())  # type: ignore[no-any-return]


def test_embedded_default() -> None:
    cfg = load_config(None, env={})
    assert cfg.server.port == 8000 and cfg.server.host == "127.0.0.1"
    (m,) = cfg.models
    assert m.name == "qwen3-8b"
    (p,) = m.pairs
    assert (p.spec.url, p.spec.served_model_name, p.spec.method, p.spec.k) == (
        "http://127.0.0.1:8101",
        "qwen3-8b-spec",
        "ngram",
        5,
    )
    assert (p.spec.prompt_lookup_min, p.spec.prompt_lookup_max) == (2, 5)
    assert (p.base.url, p.base.served_model_name, p.base.method) == (
        "http://127.0.0.1:8102",
        "qwen3-8b-base",
        None,
    )
    assert cfg.server.api_keys == [] and cfg.server.log_payloads is False
    assert m.retry.on_sibling is True


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: file not found"):
        load_config(tmp_path / "nope.yaml", env={})


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "server:\n  port: 80\n  host: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, env={})
    msg = str(e.value)
    assert str(p) in msg and "line" in msg and "invalid YAML" in msg


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"), env={})


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (lambda d: d["server"].update(port="eighty"), "server.port", "valid integer"),
        (lambda d: d["server"].update(prot=1), "server.prot", "unknown field"),
        (
            lambda d: d["models"][0]["pairs"][0]["spec"].update(url="ftp://x"),
            "models[0].pairs[0].spec.url",
            "http",
        ),
        (lambda d: d["models"][0]["pairs"][0]["spec"].pop("method"), "models[0].pairs[0]", "method"),
        (lambda d: d["models"][0]["pairs"][0]["base"].update(k=3), "models[0].pairs[0]", "plain"),
        (
            lambda d: d["models"][0]["timeouts"].update(connect_s=-1),
            "models[0].timeouts.connect_s",
            "greater than",
        ),
        (lambda d: d["models"][0]["routing"].update(policy="magic"), "models[0].routing.policy", "adaptive"),
        (lambda d: d["models"][0].update(pairs=[]), "models[0].pairs", "at least 1"),
        (lambda d: d["models"][0].update(name="has space"), "models[0].name", "letters, digits"),
        (lambda d: d["server"].update(api_keys=["short"]), "server.api_keys", "at least 8"),
        (lambda d: d["models"].append(dict(d["models"][0])), "models", "appears twice"),
    ],
)
def test_validation_errors_name_file_field_and_problem(
    tmp_path: Path, mutate, field: str, problem: str
) -> None:  # type: ignore[no-untyped-def]
    data = _minimal()
    mutate(data)
    p = _write(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_config(p, env={})
    msg = str(e.value)
    assert msg.startswith(str(p)), msg
    assert field in msg, msg
    assert problem in msg, msg


def test_env_overrides_with_nesting_lists_and_shortcuts(tmp_path: Path) -> None:
    env = {
        "SPECGATE_SERVER__PORT": "9000",
        "SPECGATE_SERVER__LOG_JSON": "true",
        "SPECGATE_MODELS__0__TIMEOUTS__TOTAL_S": "30.5",
        "SPECGATE_MODELS__0__ROUTING__POLICY": "always-base",
        "SPECGATE_MODELS__0__PAIRS__0__SPEC__URL": "http://10.0.0.1:9000/",
        "SPECGATE_API_KEYS": "key-one-111, key-two-222",
        "SPECGATE_ADMIN_KEYS": '["admin-key-1"]',
        "SPECGATE_SOMETHING_ELSE": "ignored",
        "PATH": "/usr/bin",
    }
    cfg = load_config(_write(tmp_path, _minimal()), env=env)
    assert cfg.server.port == 9000 and cfg.server.log_json is True
    assert cfg.models[0].timeouts.total_s == 30.5
    assert cfg.models[0].routing.policy == "always-base"
    assert cfg.models[0].pairs[0].spec.url == "http://10.0.0.1:9000"
    assert [k.get_secret_value() for k in cfg.server.api_keys] == ["key-one-111", "key-two-222"]
    assert [k.get_secret_value() for k in cfg.server.admin_keys] == ["admin-key-1"]


def test_env_error_names_the_variable() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"SPECGATE_SERVER__MAX_CONCURRENCY": "-4"})
    msg = str(e.value)
    assert "server.max_concurrency" in msg and "SPECGATE_SERVER__MAX_CONCURRENCY" in msg
    with pytest.raises(ConfigError, match="out of range"):
        load_config(None, env={"SPECGATE_MODELS__3__NAME": "x"})


def test_config_file_from_env(tmp_path: Path) -> None:
    data = _minimal()
    data["server"]["port"] = 8123  # type: ignore[index]
    p = _write(tmp_path, data)
    assert load_config(None, env={"SPECGATE_CONFIG": str(p)}).server.port == 8123


def test_cli_overrides_beat_env(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli_serve.configure(parser)
    args = parser.parse_args(
        ["--port", "7001", "--policy", "always-spec", "--no-scrape", "--max-concurrency", "3"]
    )
    env = {"SPECGATE_SERVER__PORT": "9000", "SPECGATE_SERVER__MAX_CONCURRENCY": "99"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        cfg = cli_serve.load_from_args(args)
    assert cfg.server.port == 7001 and cfg.server.max_concurrency == 3
    assert cfg.models[0].routing.policy == "always-spec"
    assert cfg.scrape.enabled is False


def test_overrides_accept_nested_mappings() -> None:
    cfg = load_config(None, env={}, overrides={"server": {"port": 1234, "host": None}})
    assert cfg.server.port == 1234 and cfg.server.host == "127.0.0.1"


def test_serve_check_masks_secrets_and_bad_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cli_serve.configure(parser)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECGATE_API_KEYS", "very-secret-key-1")
        assert cli_serve.main(parser.parse_args(["--check"])) == 0
    out = capsys.readouterr().out
    assert "very-secret-key-1" not in out and "**********" in out
    GatewayConfig.model_validate(yaml.safe_load(out.replace("'**********'", "'xxxxxxxxxx'")))

    bad = _write(tmp_path, {"server": {"port": 1}, "models": []})
    assert cli_serve.main(parser.parse_args(["--config", str(bad)])) == 2
    err = capsys.readouterr().err
    assert "configuration error" in err and str(bad) in err and "models" in err


def test_secrets_never_in_repr() -> None:
    cfg = load_config(None, env={"SPECGATE_API_KEYS": "super-secret-123"})
    assert "super-secret-123" not in repr(cfg) and "super-secret-123" not in str(cfg.model_dump())


def test_serve_check_rejects_a_bad_telemetry_section_naming_file_and_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cli_serve.configure(parser)
    data = _minimal()
    data["telemetry"] = {"log_format": "jsn", "tracing": "maybe", "max_label_values": 0, "bogus": 1}
    bad = _write(tmp_path, data)
    assert cli_serve.main(parser.parse_args(["--config", str(bad), "--check"])) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert f"configuration error: {bad}: 4 invalid settings" in err, err
    assert "telemetry.log_format: Input should be 'text' or 'json'" in err, err
    assert "telemetry.tracing: Input should be 'auto' or 'off'" in err, err
    assert "telemetry.max_label_values: Input should be greater than or equal to 1" in err, err
    assert "telemetry.bogus: unknown field" in err, err


def test_telemetry_section_is_typed_and_takes_env_overrides(tmp_path: Path) -> None:
    data = _minimal()
    data["telemetry"] = {"log_format": "json", "access_log": False}
    cfg = load_config(_write(tmp_path, data), env={"SPECGATE_TELEMETRY__TRACING": "off"})
    assert isinstance(cfg.telemetry, TelemetryConfig)
    tel = cfg.telemetry
    assert (tel.log_format, tel.access_log, tel.tracing) == ("json", False, "off")
    assert load_config(None, env={}).telemetry == TelemetryConfig()


def test_loading_the_config_does_not_import_telemetry_or_the_app() -> None:
    code = (
        "import sys, gateway.config; "
        "print(sorted(m for m in sys.modules if m.startswith(('gateway.telemetry', 'gateway.api', "
        "'opentelemetry'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("SPECGATE_SERVR__PORT", "unknown section 'servr' (check the spelling; did you mean 'server'?"),
        ("SPECGATE_MODEL__0__NAME", "did you mean 'models'?"),
        ("SPECGATE_SERVER____PORT", "empty name"),
    ],
)
def test_a_misspelt_env_section_is_an_error_naming_the_variable(name: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={name: "1"})
    assert str(e.value).startswith(f"environment variable {name}: ")
    assert needle in str(e.value)


def test_a_misspelt_env_field_is_an_error_too() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"SPECGATE_SERVER__PORTT": "1"})
    assert "server.portt (set by SPECGATE_SERVER__PORTT): unknown field" in str(e.value)


def test_specgate_variables_that_are_not_configuration_are_left_alone() -> None:
    env = {"SPECGATE_HEALTH_PORT": "8101", "SPECGATE_LT_QPS": "4", "SPECGATE_IMAGE": "x"}
    assert load_config(None, env=env).server.port == 8000


def _two_models() -> dict[str, object]:
    """The default with a second model (its own pair and engine names) and non-default values
    in the sections the env tests touch."""
    data = _minimal()
    data["server"].update(host="0.0.0.0", max_concurrency=77)  # type: ignore[attr-defined]
    first = data["models"][0]  # type: ignore[index]
    second = yaml.safe_load(yaml.safe_dump(first))
    second["name"] = "other-model"
    second["pairs"][0]["spec"]["name"], second["pairs"][0]["base"]["name"] = "spec1", "base1"
    second["timeouts"]["total_s"] = 99.0
    data["models"].append(second)  # type: ignore[attr-defined]
    return data


def test_env_overrides_single_fields_and_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, _two_models())
    env = {
        "SPECGATE_SERVER__PORT": "9000",
        "SPECGATE_MODELS__1__TIMEOUTS__TOTAL_S": "30",
        "SPECGATE_MODELS__0__PAIRS__0__BASE__URL": "http://10.0.0.2:8000",
    }
    cfg = load_config(path, env=env)
    assert (cfg.server.port, cfg.server.host, cfg.server.max_concurrency) == (9000, "0.0.0.0", 77)
    first, second = cfg.models
    assert (second.name, second.timeouts.total_s, second.timeouts.connect_s) == ("other-model", 30.0, 2.0)
    assert first.timeouts.total_s == 600.0 and first.pairs[0].base.url == "http://10.0.0.2:8000"
    assert first.pairs[0].spec.url == "http://127.0.0.1:8101" and first.pairs[0].base.name == "base0"
    # A JSON object for a section (or a list item) also changes only the fields it names.
    cfg = load_config(path, env={"SPECGATE_SERVER": '{"port": 9001}', "SPECGATE_MODELS__1": '{"name": "m2"}'})
    assert (cfg.server.port, cfg.server.host) == (9001, "0.0.0.0")
    assert (cfg.models[1].name, cfg.models[1].timeouts.total_s) == ("m2", 99.0)
    # A JSON list replaces the file's list.
    models = [{**_minimal()["models"][0], "name": "only"}]  # type: ignore[index, dict-item]
    cfg = load_config(path, env={"SPECGATE_MODELS": json.dumps(models)})
    assert [m.name for m in cfg.models] == ["only"]


def test_env_variable_names_are_case_insensitive() -> None:
    env = {"specgate_server__port": "9002", "SpecGate_Models__0__Routing__Policy": "always-spec"}
    cfg = load_config(None, env=env)
    assert cfg.server.port == 9002 and cfg.models[0].routing.policy == "always-spec"


def test_env_json_values_everywhere_and_plain_comma_lists() -> None:
    env = {
        "SPECGATE_MODELS__0__API_KEYS": '["model-key-111", "model-key-222"]',
        "SPECGATE_SERVER__FORWARD_HEADERS": '["x-tenant"]',
        "SPECGATE_SERVER__ADMIN_KEYS": "admin-key-111,admin-key-222",
        "SPECGATE_TELEMETRY__KNOWN_MODELS": '["qwen3-8b"]',
        "SPECGATE_SERVER__HOST": "[::1]",  # a string field keeps its string
    }
    cfg = load_config(None, env=env)
    assert cfg.server.host == "[::1]"
    assert [k.get_secret_value() for k in cfg.models[0].api_keys] == ["model-key-111", "model-key-222"]
    assert [k.get_secret_value() for k in cfg.server.admin_keys] == ["admin-key-111", "admin-key-222"]
    assert cfg.server.forward_headers == ["x-tenant"] and cfg.telemetry.known_models == ("qwen3-8b",)
    # Not JSON after all: the string goes to validation, which names the variable.
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"SPECGATE_SERVER__FORWARD_HEADERS": "[x-tenant"})
    assert "server.forward_headers (set by SPECGATE_SERVER__FORWARD_HEADERS)" in str(e.value)


def test_an_empty_key_shortcut_means_no_keys() -> None:
    # compose passes SPECGATE_API_KEYS=${SPECGATE_API_KEYS:-}: unset on the host is no client auth
    cfg = load_config(None, env={"SPECGATE_API_KEYS": "", "SPECGATE_ADMIN_KEYS": ""})
    assert cfg.server.api_keys == [] and cfg.server.admin_keys == []


def test_file_then_env_then_overrides(tmp_path: Path) -> None:
    data = _minimal()
    data["server"]["port"] = 8100  # type: ignore[index]
    path = _write(tmp_path, data)
    env = {"SPECGATE_SERVER__PORT": "9000", "SPECGATE_MODELS__0__ROUTING__POLICY": "always-base"}
    assert load_config(path, env={}).server.port == 8100
    assert load_config(path, env=env).server.port == 9000
    cfg = load_config(path, env=env, overrides={"server.port": 7000, "models.0.routing.policy": None})
    assert cfg.server.port == 7000 and cfg.models[0].routing.policy == "always-base"
    cfg = load_config(path, env=env, overrides={"models.0.routing.policy": "always-spec"})
    assert cfg.server.port == 9000 and cfg.models[0].routing.policy == "always-spec"


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("SPECGATE_MODELS__1__NAME", "index 1 out of range for models (a list of 1)"),
        ("SPECGATE_MODELS__FIRST__NAME", "expected an index into models (a list of 1)"),
        ("SPECGATE_SERVER__PORT__X", "server.port is not a mapping"),
    ],
)
def test_env_paths_that_do_not_fit_the_file_name_the_variable(name: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"SPECGATE_MODELS__0__NAME": "fine", name: "1"})
    assert str(e.value).startswith(f"environment variable {name}: {needle}"), str(e.value)


def test_a_misspelt_env_field_inside_a_list_item_names_the_variable() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, env={"SPECGATE_MODELS__0__TIMEOUTS__TOTL_S": "1"})
    assert "models[0].timeouts.totl_s (set by SPECGATE_MODELS__0__TIMEOUTS__TOTL_S): unknown field" in str(
        e.value
    )


@pytest.mark.parametrize(
    ("env", "needles"),
    [
        ({"SPECGATE_SERVR__PORT": "1"}, ["SPECGATE_SERVR__PORT", "did you mean 'server'?"]),
        ({"SPECGATE_SERVER__PORT": "eighty"}, ["server.port (set by SPECGATE_SERVER__PORT)", "integer"]),
        ({"SPECGATE_SERVER__PROT": "1"}, ["server.prot (set by SPECGATE_SERVER__PROT): unknown field"]),
        ({"SPECGATE_MODELS__2__NAME": "x"}, ["SPECGATE_MODELS__2__NAME", "out of range"]),
    ],
)
def test_serve_check_fails_cleanly_on_a_bad_env_variable(
    env: dict[str, str], needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    cli_serve.configure(parser)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert cli_serve.main(parser.parse_args(["--check"])) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("specgate: configuration error: "), captured.err
    for needle in needles:
        assert needle in captured.err, captured.err
    for raw in ("Traceback", "validation error for", "errors.pydantic.dev", "SettingsError"):
        assert raw not in captured.err, captured.err


def test_an_epp_budget_given_in_part_keeps_its_other_default(tmp_path: Path) -> None:
    cfg = load_config(None, env={"SPECGATE_EPP__LIMITS__PING__RATE": "5"})
    assert (cfg.epp.limits.ping.rate, cfg.epp.limits.ping.burst) == (5.0, 100.0)
    data = _minimal()
    data["epp"] = {"limits": {"streams": {"burst": 7}}}
    cfg = load_config(_write(tmp_path, data), env={})
    assert (cfg.epp.limits.streams.rate, cfg.epp.limits.streams.burst) == (20_000.0, 7.0)
