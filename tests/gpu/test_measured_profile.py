"""The ``h200-vllm-0.20.2-measured`` profile against the real-GPU run it was fitted to.

At concurrency 1 (one sequence per step, no prefill interference worth the name) the
per-token latency the profile predicts, (T(1, k+1) + drafting + host time) / AL, must be
within 15 % of what real vLLM 0.20.2 did on the H200 for every method, where the
unmeasured ``h200-qwen3-8b`` profile misses the draft-model engine by about 2x.
"""

from __future__ import annotations

import csv
import gzip
import json
import statistics
from pathlib import Path

import pytest

from gateway.physics import PROFILE_NAMES, get_profile

REAL = Path(__file__).resolve().parents[2] / "results" / "gpu" / "real"
CTX = 400  # mean decode context of the corpus at max_tokens <= 256
MEASURED = "h200-vllm-0.20.2-measured"


def _rows() -> list[dict[str, object]]:
    with open(REAL / "rows.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _row(spec: str, policy: str, conc: int) -> dict[str, object]:
    for r in _rows():
        if (
            r["policy"] == policy
            and r["concurrency"] == conc
            and (policy == "always-base" or r["spec_engine"] == spec)
        ):
            return r
    raise LookupError((spec, policy, conc))


def _engine_tpot(row: dict[str, object], side: str) -> tuple[float, float | None]:
    d = row[side]
    assert isinstance(d, dict)
    return float(d["engine_tpot_ms"]), (float(d["al_drafted"]) if d.get("al_drafted") else None)


def predicted_ms(profile: str, method: str | None, k: int, al: float, batch: int = 1) -> float:
    p = get_profile(profile)
    if method is None:
        return p.step_ms(batch, 1, CTX)
    step = (
        p.step_ms(batch, k + 1, CTX)
        + p.draft_ms(method, k, batch, CTX, "qwen3-0.6b")
        + p.spec_host_overhead_ms
    )
    return step / al


def test_measured_profile_is_registered() -> None:
    assert MEASURED in PROFILE_NAMES
    m, h = get_profile(MEASURED), get_profile("h200-qwen3-8b")
    assert m.step_ms(8, 4) == h.step_ms(8, 4)  # same measured step grid
    assert m.draft_pass_overhead_ms > h.draft_pass_overhead_ms  # only host-time constants differ


@pytest.mark.parametrize(
    "engine,method,k",
    [
        ("base", None, 0),
        ("eagle3-hi", "eagle3", 3),
        ("eagle3-lo", "eagle3", 3),
        ("draft-hi", "draft_model", 4),
    ],
)
def test_per_token_latency_at_concurrency_1_within_15_percent(
    engine: str, method: str | None, k: int
) -> None:
    if method is None:
        real, al = _engine_tpot(_row("", "always-base", 1), "base")
    else:
        real, al = _engine_tpot(_row(engine, "always-spec", 1), "spec")
    assert real > 0
    pred = predicted_ms(MEASURED, method, k, al or 1.0)
    assert pred == pytest.approx(real, rel=0.15)
    if method == "draft_model":  # the unmeasured profile is far off for the draft model
        assert predicted_ms("h200-qwen3-8b", method, k, al or 1.0) < 0.7 * real


def test_ngram_step_without_drafts_costs_the_measured_host_time() -> None:
    """Sampled requests on the n-gram engine drafted nothing (random-weight output never
    matches) and still paid ~2.2 ms per step over the plain engine at concurrency 1."""
    tpot: dict[str, list[float]] = {"always-base": [], "always-spec": []}
    with gzip.open(REAL / "requests.csv.gz", "rt", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            name, conc = r["point"].rsplit("-c", 1)
            if conc == "1" and r["ok"] == "True" and r["tpot"] and float(r["temperature"]) > 0:
                for policy in tpot:
                    if name == f"ngram-{policy}":
                        tpot[policy].append(1000 * float(r["tpot"]))
    base, spec = statistics.fmean(tpot["always-base"]), statistics.fmean(tpot["always-spec"])
    p = get_profile(MEASURED)
    pred = p.step_ms(1, 1, CTX) + p.draft_ms("ngram", 5, 1) + p.spec_host_overhead_ms
    assert spec > 1.3 * base
    assert pred == pytest.approx(spec, rel=0.15)
