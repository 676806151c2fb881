"""Windows of steps read off vLLM /metrics pages: exact on synthetic pages in vLLM's
exposition format, and only where the pair's other engine took no step."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.calibrate.windows import pair_windows, parse_scrape, window_between

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.20.2"


def page(
    model: str,
    *,
    steps: float,
    itl_count: float,
    itl_sum: float,
    running: float,
    prompt: float = 0.0,
    cached: float = 0.0,
    draft_tokens: float | None = None,
    requests: float = 0.0,
    prompt_per_req: float = 500.0,
    gen_per_req: float = 200.0,
) -> str:
    """A /metrics page with the families a fit reads, as vLLM 0.20.2 writes them."""
    lv = f'engine="0",model_name="{model}"'
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{lv}}} {running}",
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{lv}}} {prompt}",
        "# TYPE vllm:prompt_tokens_cached counter",
        f"vllm:prompt_tokens_cached_total{{{lv}}} {cached}",
        "# TYPE vllm:iteration_tokens_total histogram",
        f'vllm:iteration_tokens_total_bucket{{{lv},le="1.0"}} 0.0',
        f'vllm:iteration_tokens_total_bucket{{{lv},le="+Inf"}} {steps}',
        f"vllm:iteration_tokens_total_count{{{lv}}} {steps}",
        f"vllm:iteration_tokens_total_sum{{{lv}}} {steps * 3}",
        "# TYPE vllm:inter_token_latency_seconds histogram",
        f'vllm:inter_token_latency_seconds_bucket{{{lv},le="+Inf"}} {itl_count}',
        f"vllm:inter_token_latency_seconds_count{{{lv}}} {itl_count}",
        f"vllm:inter_token_latency_seconds_sum{{{lv}}} {itl_sum}",
        "# TYPE vllm:request_prompt_tokens histogram",
        f"vllm:request_prompt_tokens_count{{{lv}}} {requests}",
        f"vllm:request_prompt_tokens_sum{{{lv}}} {requests * prompt_per_req}",
        "# TYPE vllm:request_generation_tokens histogram",
        f"vllm:request_generation_tokens_count{{{lv}}} {requests}",
        f"vllm:request_generation_tokens_sum{{{lv}}} {requests * gen_per_req}",
    ]
    if draft_tokens is not None:
        lines += [
            "# TYPE vllm:spec_decode_num_draft_tokens counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{lv}}} {draft_tokens}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lv},position="{i}"}} 1.0' for i in range(3)
        ]
    return "\n".join(lines) + "\n"


def test_a_window_reads_step_time_batch_tokens_prefill_and_context_exactly() -> None:
    # 100 steps of 16 sequences at 9 ms, 2 drafts per sequence per step, 800 prompt
    # tokens (200 from the prefix cache), 4 requests of 500 + 200 tokens finished
    old = parse_scrape(page("s", steps=50, itl_count=400, itl_sum=3.0, running=16, draft_tokens=10), 1.0)
    new = parse_scrape(
        page(
            "s",
            steps=150,
            itl_count=2000,
            itl_sum=3.0 + 1600 * 0.009,
            running=16,
            prompt=800,
            cached=200,
            draft_tokens=10 + 3200,
            requests=4,
        ),
        5.0,
    )
    assert new.spec_k == 3
    w = window_between(old, new, spec=True)
    assert w is not None
    assert w.step_ms == pytest.approx(9.0)
    assert w.batch == pytest.approx(16.0)
    assert w.q == pytest.approx(3.0)
    assert w.prefill_tokens == pytest.approx(6.0)
    assert w.ctx == pytest.approx(600.0)
    assert window_between(old, old, spec=True) is None  # no steps: nothing to say


def _scrapes(model: str, rates: list[tuple[float, float]]) -> list:  # type: ignore[type-arg]
    """Scrapes every second of an engine running ``(batch, step_ms)`` in each second."""
    steps = itl_c = itl_s = 0.0
    out = [parse_scrape(page(model, steps=0, itl_count=0, itl_sum=0, running=rates[0][0]), 0.0)]
    for i, (batch, ms) in enumerate(rates, start=1):
        n = 0.0 if batch == 0 else 1000.0 / ms
        steps += n
        itl_c += n * batch
        itl_s += n * batch * ms / 1e3
        out.append(
            parse_scrape(page(model, steps=steps, itl_count=itl_c, itl_sum=itl_s, running=batch), float(i))
        )
    return out


def test_windows_are_kept_only_while_the_other_engine_takes_no_step() -> None:
    # seconds 0-4: the plain engine alone at batch 8; 4-8: both; 8-12: spec alone at 4
    base = _scrapes("b", [(8, 7.0)] * 4 + [(8, 9.0)] * 4 + [(0, 0.0)] * 4)
    spec = _scrapes("s", [(0, 0.0)] * 4 + [(4, 9.0)] * 4 + [(4, 8.0)] * 4)
    ws = pair_windows(spec, base, window_s=2.0, min_steps=20)
    plain = [w for w in ws if not w.spec]
    specs = [w for w in ws if w.spec]
    assert [round(w.step_ms, 6) for w in plain] == [7.0, 7.0]
    assert [round(w.batch, 6) for w in plain] == [8.0, 8.0]
    assert [round(w.step_ms, 6) for w in specs] == [8.0, 8.0]


def test_a_change_of_load_inside_a_window_leaves_it_out() -> None:
    base = _scrapes("b", [(2, 7.0)] * 2 + [(16, 8.0)] * 3)
    spec = _scrapes("s", [(0, 0.0)] * 5)
    ws = pair_windows(spec, base, window_s=2.0, min_steps=20)
    assert [round(w.batch, 6) for w in ws] == [2.0, 16.0]


@pytest.mark.parametrize("kind", ["base", "spec"])
def test_real_vllm_pages_parse(kind: str) -> None:
    s = parse_scrape((FIXTURES / f"metrics-{kind}.txt").read_text(encoding="utf-8"), 0.0)
    assert s.get("vllm:iteration_tokens_total_count") > 0
    assert s.get("vllm:inter_token_latency_seconds_count") > 0
    assert s.spec_k == (4 if kind == "spec" else 0)
