from __future__ import annotations

import pytest

from gateway.routing.overlap import KINDS, predict_overlap, realised_lookup_acceptance

CODE = (
    "```python\n" + "\n".join(f"def f{i}(x):\n    return x * {i} + helper(x)\n" for i in range(30)) + "```\n"
)
DOC = " ".join(
    f"Sentence {i} of the quarterly report says revenue grew in region {i % 7}." for i in range(80)
)

CASES = [
    ("Rename helper to assist and return the whole file unchanged otherwise.\n" + CODE, "edit", 0.6),
    (CODE + "\nFix the bug in f3 and return the full code.", "edit", 0.6),
    ("Summarize the following report in five bullet points.\n\n" + DOC, "summary", 0.1),
    ("Extract every sentence that mentions region 3, verbatim.\n\n" + DOC, "extract", 0.4),
    ("Context:\n[1] " + DOC + "\n\nQuestion: what grew?", "rag", 0.2),
    ("What is the capital of France?", "chat", 0.0),
    ("Write me a poem about the sea.", "chat", 0.0),
]


@pytest.mark.parametrize(("prompt", "kind", "min_overlap"), CASES)
def test_kinds_and_overlap(prompt: str, kind: str, min_overlap: float) -> None:
    ov, k = predict_overlap(prompt, prompt)
    assert k == kind and k in KINDS
    assert min_overlap <= ov <= 1.0


def test_order_copy_heavy_above_chat() -> None:
    edit, _ = predict_overlap(CASES[0][0], CASES[0][0])
    summ, _ = predict_overlap(CASES[2][0], CASES[2][0])
    chat, _ = predict_overlap("Why is the sky blue?", "Why is the sky blue?")
    assert edit > summ > chat


def test_huge_prompt_does_not_crash_and_is_bounded() -> None:
    big = "Refactor this module.\n" + CODE * 200
    ov, kind = predict_overlap(big, "Refactor this module.")
    assert kind == "edit" and 0 < ov <= 1


def test_realised_lookup_acceptance() -> None:
    copy = CODE.replace("helper", "assist")
    high = realised_lookup_acceptance(CODE, copy)
    low = realised_lookup_acceptance(CODE, "The sky is blue because of Rayleigh scattering of sunlight.")
    assert high is not None and low is not None
    assert high > 0.15 > low  # per step over the whole answer, n-grams of 5 (vLLM's default)
    assert realised_lookup_acceptance(CODE, "") is None


def test_realised_lookup_rates_report_drafting_cost() -> None:
    from gateway.routing.overlap import realised_lookup_rates

    copy = CODE.replace("helper", "assist")
    rates = realised_lookup_rates(CODE, copy)
    assert rates is not None
    acc, drafted = rates
    assert 0 < acc * 5 <= drafted <= 5  # accepted ≤ drafted ≤ k per step
    assert realised_lookup_rates(CODE, "x", n_min=6, n_max=5) is None
