"""Launching engines: CLI flags, YAML config, engines sharing a device, per-engine flags."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from gateway.cli import build_parser
from specgate_lab.emulator.cli_emulate import build_launches
from specgate_lab.emulator.launch import load_config, start_group

pytestmark = pytest.mark.timeout(60)


def _args(*argv: str):  # type: ignore[no-untyped-def]
    argv = ("emulate", *argv)
    return build_parser(list(argv)).parse_args(list(argv))


def test_cli_single_and_pair() -> None:
    (one,), scale = build_launches(
        _args(
            "--served-model-name",
            "m-spec",
            "--speculative-config",
            '{"method":"eagle3","num_speculative_tokens":3}',
            "--port",
            "9999",
            "--error-rate",
            "0.5",
            "--time-scale",
            "3",
        )
    )
    assert one.config.served_model_name == "m-spec" and one.port == 9999 and scale == 3.0
    assert one.config.spec is not None and one.config.spec.method == "eagle3"
    assert one.faults.error_rate == 0.5
    pair, pair_scale = build_launches(_args("--pair", "--disable-log-stats"))
    assert pair_scale == 1.0
    assert [(ln.config.served_model_name, ln.port, ln.device) for ln in pair] == [
        ("qwen3-8b-spec", 8101, "gpu0"),
        ("qwen3-8b-base", 8102, "gpu0"),
    ]
    spec = pair[0].config.spec
    assert spec is not None and (spec.method, spec.k, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "ngram",
        5,
        2,
        5,
    )
    assert pair[1].config.spec is None and not any(ln.log_stats for ln in pair)


def test_yaml_config_and_unknown_keys(tmp_path: Path) -> None:
    good = tmp_path / "engines.yaml"
    good.write_text(
        "time_scale: 2\n"
        "engines:\n"
        "  - {served_model_name: a, port: 0, device: g1, speculative_config: "
        "{method: ngram, num_speculative_tokens: 3, prompt_lookup_min: 2}, "
        "per_request_spec_decode_metrics: summary, spec_cost_scale: 0.5}\n"
        "  - {served_model_name: b, port: 0, device: g1, disable_log_stats: true, faults: {error_rate: 1}}\n"
    )
    launches, scale = load_config(str(good))
    assert scale == 2.0 and [ln.device for ln in launches] == ["g1", "g1"]
    # The CLI: the YAML's time_scale unless --time-scale is given.
    assert build_launches(_args("--config", str(good)))[1] == 2.0
    assert build_launches(_args("--config", str(good), "--time-scale", "5"))[1] == 5.0
    assert (
        launches[0].per_request_metrics and not launches[1].log_stats and launches[1].faults.error_rate == 1
    )
    assert [ln.config.spec_cost_scale for ln in launches] == [0.5, 1.0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines:\n  - {served_model_name: a, colour: blue}\n")
    with pytest.raises(ValueError, match="colour"):
        load_config(str(bad))
    for scale in ("-1", "[1]", "abc"):
        bad.write_text(f"engines:\n  - {{served_model_name: a, spec_cost_scale: {scale}}}\n")
        with pytest.raises(ValueError, match="spec_cost_scale"):
            load_config(str(bad))
    # the engine's own bound: the command line meets it too
    with pytest.raises(ValueError, match="spec_cost_scale"):
        build_launches(_args("--pair", "--spec-cost-scale", "11"))


async def test_engines_on_one_device_share_a_driver_and_flags_apply(tmp_path: Path) -> None:
    cfg = tmp_path / "engines.yaml"
    cfg.write_text(
        "engines:\n"
        "  - {served_model_name: a, port: 0, device: g1, speculative_config: "
        "{method: ngram, num_speculative_tokens: 3, prompt_lookup_min: 2}, "
        "per_request_spec_decode_metrics: summary, spec_cost_scale: 0.5}\n"
        "  - {served_model_name: b, port: 0, device: g1, disable_log_stats: true}\n"
        "  - {served_model_name: c, port: 0, device: g2}\n"
    )
    launches, _ = load_config(str(cfg))
    group = await start_group(launches, time_scale=0.05)
    try:
        a, b, c = group.engines
        assert a.handle.driver is b.handle.driver is not c.handle.driver
        assert a.handle.driver.device.engines == [a.handle.engine, b.handle.engine]
        async with aiohttp.ClientSession() as s:
            async with s.get(b.url + "/metrics") as r:
                assert "vllm:" not in await r.text()
            async with s.post(b.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
                assert "metrics" not in await r.json()
            async with s.post(a.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
                assert "speculative_decoding" in (await r.json())["metrics"]
    finally:
        await group.stop()


async def test_hang_mid_stream_keeps_the_connection_open() -> None:
    from specgate_lab.emulator.launch import pair_launches

    launches = pair_launches(port_spec=0, port_base=0)
    launches[1].faults.hang = "mid_stream"
    launches[1].faults.mid_stream_chunks = 2
    group = await start_group(launches, time_scale=0.05)
    try:
        url = group.engines[1].url
        async with aiohttp.ClientSession() as s:
            resp = await s.post(
                url + "/v1/completions", json={"prompt": "hi", "max_tokens": 50, "stream": True}
            )
            got = [await resp.content.readline() for _ in range(4)]  # 2 events + separators
            assert sum(1 for line in got if line.startswith(b"data: {")) == 2
            more = asyncio.ensure_future(resp.content.readline())
            done, _ = await asyncio.wait({more}, timeout=0.3)
            assert not done, "the stream must stall"
            async with s.post(url + "/_emulator/faults", json={"hang": "none"}) as r:
                assert r.status == 200
            rest = await more + await resp.content.read()
            assert rest.rstrip().endswith(b"data: [DONE]")
            resp.close()
    finally:
        await group.stop()


def test_reasoning_settings_from_flags_and_yaml(tmp_path: Path) -> None:
    pair, _ = build_launches(
        _args("--pair", "--reasoning-parser", "qwen3", "--reasoning-field", "reasoning_content")
    )
    assert [ln.config.reasoning_parser for ln in pair] == ["qwen3", "qwen3"]
    assert [ln.config.reasoning_field for ln in pair] == ["reasoning_content"] * 2
    (one,), _ = build_launches(
        _args("--reasoning-parser", "qwen3", "--reasoning-parser-mode", "generated-only")
    )
    assert one.config.reasoning_parser_mode == "generated-only"
    assert build_launches(_args())[0][0].config.reasoning_parser is None  # off by default, as vLLM
    cfg = tmp_path / "engines.yaml"
    cfg.write_text("engines:\n  - {served_model_name: a, reasoning_parser: qwen3}\n")
    assert load_config(str(cfg))[0][0].config.reasoning_parser == "qwen3"
    cfg.write_text("engines:\n  - {served_model_name: a, reasoning_parser: deepseek_r1}\n")
    with pytest.raises(ValueError, match="reasoning_parser"):
        load_config(str(cfg))


def test_cli_profile_file_and_device_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.physics import FitParams, FittedProfile

    path = tmp_path / "my-gpu.json"
    path.write_text(
        FittedProfile("my-gpu", "m", FitParams(base_ms=9.0, token_ms=0.02)).to_json(), encoding="utf-8"
    )
    pair, _ = build_launches(_args("--pair", "--profile", str(path), "--device-scale", "1.3"))
    assert [(ln.config.profile, ln.config.device_scale) for ln in pair] == [(str(path), 1.3)] * 2
    with pytest.raises(SystemExit):
        _args("--profile", str(tmp_path / "missing.json"))
    with pytest.raises(SystemExit):
        _args("--profile", "no-such-gpu")
    assert "fitted profile" in capsys.readouterr().err
