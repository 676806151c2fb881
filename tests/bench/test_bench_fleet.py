"""``specgate bench --pairs N``: one model over N emulated pairs, each its own emulator (its
own device timeline), through the real gateway and sockets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gateway.config.models import GatewayConfig
from specgate_lab.bench import cli_bench
from specgate_lab.bench.procs import gateway_config


def test_the_config_of_n_pairs_has_one_model_with_a_device_per_pair() -> None:
    cfg = GatewayConfig.model_validate(gateway_config(8000, 8001, 8002, "adaptive", more=[(8003, 8004)]))
    (model,) = cfg.models
    assert [(p.spec.name, p.base.name, p.device) for p in model.pairs if p.spec is not None] == [
        ("spec0", "base0", "gpu0"),
        ("spec1", "base1", "gpu1"),
    ]
    assert model.pairs[1].spec is not None and model.pairs[1].spec.url == "http://127.0.0.1:8003"
    one = gateway_config(8000, 8001, 8002, "adaptive")
    assert gateway_config(8000, 8001, 8002, "adaptive", more=[]) == one


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli_bench.configure(p)
    return p.parse_args(list(argv))


def test_pairs_must_be_positive_and_scenarios_run_one_pair(tmp_path: Path) -> None:
    assert cli_bench.main(_args("--pairs", "0", "--out", str(tmp_path))) == 2
    assert cli_bench.main(_args("--pairs", "2", "--scenario", "day32", "--out", str(tmp_path))) == 2


@pytest.mark.timeout(240)
def test_bench_over_two_emulated_pairs_serves_every_request_on_both(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    args = _args(
        "--pairs", "2", "--policies", "adaptive,always-base", "--qps", "6", "--duration", "3",
        "--min-requests", "12", "--warmup", "1", "--time-scale", "2", "--max-tokens-cap", "64",
        "--out", str(out),
    )  # fmt: skip
    assert cli_bench.main(args) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["meta"]["pairs"] == 2 and "2 h200-qwen3-8b pairs" in doc["meta"]["title"]
    rows = {r["policy"]: r for r in doc["results"]}
    assert set(rows) == {"adaptive", "always-base"}
    for row in rows.values():
        assert row["failures"] == 0 and row["unfinished"] == 0 and row["requests"] >= 12
        assert set(row["pair_share"]) == {"0", "1"}  # placement used both pairs
        assert abs(sum(row["pair_share"].values()) - 1.0) < 0.01
    assert rows["always-base"]["spec_share"] == 0.0
