"""Scenarios: the shared schedule grammar, time-varying Poisson arrivals, the registry, the CLI."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from specgate_lab.sim import cli_simulate
from specgate_lab.sim.plan import plan
from specgate_lab.sim.scenarios import (
    SCENARIOS,
    Pair,
    Phase,
    Scenario,
    arrival_times,
    from_schedule,
    get_scenario,
    scenario_requests,
)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_simulate.configure(parser)
    return parser.parse_args(list(argv))


def test_schedule_grammar_gives_ramps_and_steps() -> None:
    sc = from_schedule("ramp:0.5-32:300,32:60,ramp:32-0.5:300")
    assert [(p.start_qps, p.end_qps, p.duration_s) for p in sc.phases] == [
        (0.5, 32, 300),
        (32, 32, 60),
        (32, 0.5, 300),
    ]
    assert sc.qps_at(150) == pytest.approx(16.25)
    assert sc.qps_at(330) == 32
    assert sc.qps_at(660) == 0.0
    with pytest.raises(ValueError, match="needs a duration"):
        from_schedule("4")  # open-ended last stage: a simulation needs an end
    with pytest.raises(ValueError, match="never sends"):
        from_schedule("0:10")


def test_cli_runs_a_ramped_schedule(tmp_path: Path) -> None:
    args = _args(
        "--schedule", "ramp:1-4:20,4:10", "--policies", "always-spec,always-base",
        "--warmup", "0", "--out", str(tmp_path),
    )  # fmt: skip
    assert cli_simulate.main(args) == 0
    for name in ("results.csv", "results.json", "results.md", "results.png", "minutes.csv", "phases.csv"):
        assert (tmp_path / name).stat().st_size > 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["policy"] for r in data["rows"]] == ["always-spec", "always-base", "oracle"]
    assert len(data["meta"]["phases"]) == 2
    assert cli_simulate.main(_args("--schedule", "ramp:1-x:20", "--out", str(tmp_path))) == 2


def test_dynamic_sd_baseline_runs_one_engine_that_drops_to_k0_above_its_batch(tmp_path: Path) -> None:
    """The default scenario policies add the Dynamic SD single engine; with a threshold of
    one request it speculates alone and drops to K=0 (paying the overhead) once loaded."""
    args = _args(
        "--schedule", "1:15,24:15", "--mix", "edit=1", "--temperature", "0",
        "--dynamic-sd-max-batch", "1", "--warmup", "0", "--out", str(tmp_path),
    )  # fmt: skip
    assert cli_simulate.main(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    rows = {r["policy"]: r for r in data["rows"]}
    assert set(rows) == {"adaptive", "always-spec", "always-base", "oracle", "dynamic-sd"}
    assert rows["dynamic-sd"]["spec_share"] == 1.0
    # loaded, K=0 is plain decoding plus overhead: slower than the plain engine alone
    assert rows["dynamic-sd"]["mean_tpot_ms"] > rows["always-base"]["mean_tpot_ms"]
    assert data["adaptive"]["vs_dynamic_sd"] == pytest.approx(
        rows["adaptive"]["mean_tpot_ms"] / rows["dynamic-sd"]["mean_tpot_ms"]
    )
    assert cli_simulate.main(_args("--schedule", "1:5", "--dynamic-sd-max-batch", "0")) == 2


SYNTHETIC = '{"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.2, 0.1]}'


def test_the_engines_truth_and_config_can_differ_from_the_routers_prior(tmp_path: Path) -> None:
    """--spec-config, --max-num-seqs and --spec-cost-scale reach the simulated engines:
    speculation made dearer than the profile says makes always-spec slower; the run's
    settings are in the report; bad values are refused before anything runs."""

    def spec_tpot(*extra: str) -> float:
        out = tmp_path / "x".join(extra).replace("/", "_")[:60]
        args = _args(
            "--schedule", "8:20", "--policies", "always-spec", "--warmup", "0",
            "--method", "eagle3", "-k", "3", "--max-num-seqs", "16", "--out", str(out),
            "--spec-config", SYNTHETIC, *extra,
        )  # fmt: skip
        assert cli_simulate.main(args) == 0
        data = json.loads((out / "results.json").read_text())
        assert data["meta"]["max_num_seqs"] == 16
        assert data["meta"]["spec_config"]["synthetic_acceptance_rates"] == [0.5, 0.2, 0.1]
        return float(data["rows"][0]["mean_tpot_ms"])

    assert spec_tpot("--spec-cost-scale", "3") > 1.1 * spec_tpot()
    for bad in (
        ("--spec-config", "[1]"),
        ("--spec-config", '{"num_speculative_tokens": 0}'),
        ("--max-num-seqs", "0"),
        ("--spec-cost-scale", "-1"),
        ("--spec-overhead-ms", "-1"),
    ):
        assert cli_simulate.main(_args("--schedule", "1:5", "--out", str(tmp_path), *bad)) == 2


def test_cli_lists_scenarios_and_rejects_unknown(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli_simulate.main(_args("--scenario", "list")) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in SCENARIOS)
    assert cli_simulate.main(_args("--scenario", "nope", "--out", str(tmp_path))) == 2
    assert cli_simulate.main(_args("--scenario", "day32", "--schedule", "1:5", "--out", str(tmp_path))) == 2


def test_time_varying_rate_is_followed() -> None:
    """Thinning: a ramp 0 → 100 QPS over 100 s puts a quarter of its arrivals in the first half."""
    times = [t for t, _ in arrival_times((Phase(100, 0, 100),), random.Random(3))]
    assert len(times) == pytest.approx(5000, rel=0.05)
    first = sum(1 for t in times if t < 50)
    assert first / len(times) == pytest.approx(0.25, abs=0.02)
    assert all(0 <= t < 100 for t in times)


def test_constant_phase_draws_a_homogeneous_process() -> None:
    rng = random.Random(5)
    expected, t = [], rng.expovariate(4)
    while t < 30:
        expected.append(t)
        t += rng.expovariate(4)
    got = [t for t, _ in arrival_times((Phase(30, 4, 4),), random.Random(5))]
    assert got == expected


def test_registry_has_the_named_scenarios_of_sane_length() -> None:
    for name in ("day32", "day48", "day48-copy", "mix-shift", "temp-shift", "load-step"):
        sc = get_scenario(name)
        assert 540 <= sc.duration_s <= 900, name
    assert max(p.peak_qps for p in get_scenario("day48").phases) == 48
    mix = get_scenario("mix-shift").phases
    assert [(p.mix, p.temperature) for p in mix] == [("edit=1", "0"), ("chat=1", "1"), ("edit=1", "0")]
    assert {p.start_qps for p in mix} == {1.5}
    with pytest.raises(ValueError, match="unknown scenario"):
        get_scenario("nope")


def test_phases_switch_mix_and_temperature() -> None:
    sc = get_scenario("mix-shift").scaled(0.1)
    reqs = scenario_requests(sc.phases, seed=1, mix=None, temperature="uniform:0:1", max_tokens_cap=256)
    kinds = {(r.kind, r.temperature) for t, r in reqs if t < 18}
    assert kinds == {("edit", 0.0)}
    assert {(r.kind, r.temperature) for t, r in reqs if 18 <= t < 36} == {("chat", 1.0)}


def test_temperature_shift_keeps_the_prompts() -> None:
    sc = get_scenario("temp-shift").scaled(0.05)
    reqs = scenario_requests(sc.phases, seed=2, mix=None, temperature="uniform:0:1", max_tokens_cap=256)
    cold = [r for t, r in reqs if t < 12]
    hot = [r for t, r in reqs if 12 <= t < 24]
    n = min(len(cold), len(hot))
    assert n > 5
    assert [r.messages for r in cold[:n]] == [r.messages for r in hot[:n]]
    assert {r.temperature for r in cold} == {0.0} and {r.temperature for r in hot} == {1.0}


def test_sweep_over_seeds_reports_per_seed_ratios(tmp_path: Path) -> None:
    args = _args("--qps", "2", "--duration", "4", "--warmup", "0", "--seeds", "1,2", "--out", str(tmp_path))
    assert cli_simulate.main(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert sorted({(r["seed"], r["policy"]) for r in data["results"]}) == sorted(
        (s, p) for s in (1, 2) for p in ("adaptive", "always-spec", "always-base")
    )
    md = (tmp_path / "results.md").read_text()
    assert "| QPS | seed 1 | seed 2 | max |" in md and "max over all points and seeds" in md


def test_a_scenario_names_its_engine_pair_and_explicit_flags_override_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scenario's pair (method, k, spec config, batch cap, truth scales and slopes) reaches
    every run; a flag given on the command line wins, even one equal to the flag's default."""
    rates = '{"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.4, 0.15, 0.05]}'
    pair = Pair("eagle3", 3, rates, 64, 2.0, -0.8, 0.96, 0.18)
    sc = Scenario("e3-test", "an EAGLE-3 day", from_schedule("ramp:1-4:10,4:5").phases, pair)
    monkeypatch.setitem(SCENARIOS, sc.name, sc)
    cfgs = plan(_args("--scenario", "e3-test", "--policies", "adaptive,always-spec")).configs
    assert len(cfgs) == 2
    for c in cfgs:
        assert (c.method, c.k, c.max_num_seqs) == ("eagle3", 3, 64)
        assert c.spec_extra == json.loads(rates)
        assert (c.spec_cost_scale, c.spec_cost_slope, c.device_scale, c.device_scale_slope) == (
            2.0,
            -0.8,
            0.96,
            0.18,
        )
    flags = ("--max-num-seqs", "256", "--spec-cost-slope", "0", "-k", "2", "--device-scale", "1.5")
    c = plan(_args("--scenario", "e3-test", "--policies", "adaptive", *flags)).configs[0]
    assert (c.method, c.k, c.max_num_seqs) == ("eagle3", 2, 256)
    assert (c.spec_cost_scale, c.spec_cost_slope, c.device_scale, c.device_scale_slope) == (
        2.0,
        0.0,
        1.5,
        0.18,
    )
    assert sc.scaled(0.5).pair == pair
    assert "--method eagle3 -k 3" in pair.describe() and "--max-num-seqs 64" in pair.describe()
    assert Pair().describe() == ""


def test_a_scenario_without_a_pair_runs_the_default_or_the_command_lines() -> None:
    c = plan(_args("--scenario", "mix-shift", "--policies", "adaptive")).configs[0]
    assert (c.method, c.k, c.max_num_seqs, c.spec_extra, c.spec_cost_scale) == ("ngram", 5, 256, {}, 1.0)
    args = _args("--scenario", "mix-shift", "--policies", "adaptive", "--method", "eagle3", "-k", "3")
    c = plan(args).configs[0]
    assert (c.method, c.k) == ("eagle3", 3)
    with pytest.raises(ValueError, match="spec-cost-slope"):
        plan(_args("--scenario", "mix-shift", "--spec-cost-slope", "2"))


def test_the_eagle3_family_holds_issue_52s_days_and_errors_of_both_signs_on_both_engines() -> None:
    family = [s for s in SCENARIOS.values() if s.pair.method == "eagle3"]
    assert {(s.pair.k, s.pair.max_num_seqs) for s in family} == {(3, 64)}
    r16, new = get_scenario("eagle3-round16"), get_scenario("eagle3-newuser")
    assert [(p.start_qps, p.end_qps, p.duration_s) for p in r16.phases] == [
        (1, 40, 40),
        (40, 40, 20),
        (40, 1, 40),
    ]
    assert [(p.start_qps, p.end_qps, p.duration_s) for p in new.phases] == [
        (1, 48, 50),
        (48, 48, 25),
        (48, 1, 50),
    ]
    for sc, truth in ((r16, (2.0, -0.8, 0.96, 0.18)), (new, (1.7, -0.6, 1.05, 0.12))):
        p = sc.pair
        assert (p.spec_cost_scale, p.spec_cost_slope, p.device_scale, p.device_scale_slope) == truth
    rates = {s.name: json.loads(s.pair.spec_config or "{}")["synthetic_acceptance_rates"] for s in family}
    assert rates["eagle3-round16"] == [0.4, 0.15, 0.05] and rates["eagle3-newuser"] == [0.5, 0.25, 0.1]
    slopes = [(s.pair.spec_cost_slope or 0.0, s.pair.device_scale_slope or 0.0) for s in family]
    assert any(a > 0 for a, _ in slopes) and any(a < 0 for a, _ in slopes)  # spec's error grows / shrinks
    assert any(b > 0 for _, b in slopes) and any(b < 0 for _, b in slopes)  # both engines' error, too
