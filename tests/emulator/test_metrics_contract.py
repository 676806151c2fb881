"""The emulator's /metrics matches a real vLLM 0.20.2 page family by family."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineConfig
from specgate_lab.emulator.metrics import EngineMetrics
from specgate_lab.emulator.spec import parse_spec_config
from tests.emulator.conftest import run_all
from tests.gpu.vllm_families import READ_BY_GATEWAY, SPEC_FAMILIES
from tests.gpu.vllm_families import REMOVED as REMOVED_IN_0_20

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.20.2"

# Not exported by the emulator either, nor the old acceptance-rate gauge.
REMOVED = (*REMOVED_IN_0_20, "vllm:spec_decode_draft_acceptance_rate")

Shape = dict[str, tuple[str, frozenset[str], tuple[str, ...]]]


def _shape(text: str) -> Shape:
    """family -> (type, label names, histogram bucket bounds)."""
    out: Shape = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        labels: set[str] = set()
        les: list[str] = []
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket") and s.labels.get("le") not in les:
                les.append(s.labels["le"])
        out[fam.name] = (fam.type, frozenset(labels), tuple(les))
    return out


def _emulated_page(spec: bool, log_stats: bool = True) -> str:
    cfg = EngineConfig(
        "qwen3-8b-spec" if spec else "qwen3-8b-base",
        spec=parse_spec_config(
            '{"method":"draft_model","num_speculative_tokens":4,"rejection_sample_method":"synthetic",'
            '"synthetic_acceptance_rates":[0.8,0.65,0.5,0.4]}'
            if spec
            else None
        ),
    )
    m = EngineMetrics(
        cfg.served_model_name, spec_k=4 if spec else None, max_model_len=4096, log_stats=log_stats
    )
    dev = Device()
    eng = dev.attach(Engine(cfg, observer=m))
    m.engine = eng
    for i in range(4):
        dev.submit(eng, eng.make_request("Why is the sky blue?", max_tokens=32, seed=i), 0.0)
    run_all(dev)
    return m.render().decode()


@pytest.mark.parametrize("spec", [True, False], ids=["spec", "base"])
def test_families_match_real_vllm_page(spec: bool) -> None:
    real = _shape((FIXTURES / ("metrics-spec.txt" if spec else "metrics-base.txt")).read_text())
    ours = _shape(_emulated_page(spec))
    wanted = READ_BY_GATEWAY + (SPEC_FAMILIES if spec else ())
    for name in wanted:
        assert name in real, f"{name} missing from the real page"
        assert name in ours, f"{name} missing from the emulator"
        assert ours[name] == real[name], name
    # every vllm:* family of the real page exists here with the same type and labels
    # (cache_config_info's many labels are configuration, not contract)
    for name, (typ, labels, les) in real.items():
        assert name in ours, name
        if name != "vllm:cache_config_info":
            assert ours[name] == (typ, labels, les), name
    if not spec:
        assert not any(n.startswith("vllm:spec_decode") for n in ours)
    for name in REMOVED:
        assert name not in ours


def test_per_position_labels_and_finished_reasons() -> None:
    page = _emulated_page(True)
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    positions = sorted(
        s.labels["position"]
        for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
        if s.name.endswith("_total")
    )
    assert positions == ["0", "1", "2", "3"]
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    for f in fams.values():
        for s in f.samples:
            if f.name.startswith("vllm:") and f.name != "vllm:cache_config_info":
                assert s.labels["engine"] == "0"
                assert s.labels["model_name"] == "qwen3-8b-spec"
    done = sum(s.value for s in fams["vllm:request_success"].samples if s.name.endswith("_total"))
    assert done == 4
    assert "# TYPE vllm:generation_tokens_created gauge" in page  # as prometheus_client writes it


def test_disable_log_stats_removes_every_vllm_family() -> None:
    page = _emulated_page(True, log_stats=False)
    names = {f.name for f in text_string_to_metric_families(page)}
    assert names, "process/python metrics remain"
    assert not any(n.startswith("vllm:") for n in names)
