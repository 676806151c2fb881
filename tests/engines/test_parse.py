from __future__ import annotations

import pytest

from gateway.engines.parse import MetricsParseError, MetricsWindow, parse_metrics
from tests.engines.conftest import bump

SPEC = 'vllm:spec_decode_num_{}_total{{engine="0",model_name="qwen3-8b-spec"}}'
POS = (
    "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    '{{engine="0",model_name="qwen3-8b-spec",position="{}"}}'
)
TPOT = 'vllm:request_time_per_output_token_seconds_{}{{engine="0",model_name="qwen3-8b-spec"}}'
ITL = 'vllm:inter_token_latency_seconds_{}{{engine="0",model_name="qwen3-8b-spec"}}'
GEN = 'vllm:generation_tokens_total{engine="0",model_name="qwen3-8b-spec"}'


def test_real_spec_page(spec_page: str) -> None:
    s = parse_metrics(spec_page)
    assert (s.drafts, s.draft_tokens, s.accepted) == (15472.0, 61888.0, 36458.0)
    assert s.per_position == (12413.0, 10081.0, 7763.0, 6201.0)
    assert (s.running, s.waiting, s.kv_usage) == (0.0, 0.0, 0.0)
    assert s.tpot_count == 404.0 and s.tpot_sum == pytest.approx(10.226083110314967)
    assert s.has_spec_metrics


def test_real_base_page_has_no_spec_counters(base_page: str) -> None:
    s = parse_metrics(base_page)
    assert s.drafts is None and s.accepted is None and s.per_position is None  # unknown, not 0
    assert s.generation_tokens == 97280.0 and s.tpot_count == 760.0
    assert not s.has_spec_metrics and s.has_vllm_metrics


def test_model_filter(spec_page: str) -> None:
    assert parse_metrics(spec_page, "other-model").drafts is None
    assert parse_metrics(spec_page, "qwen3-8b-spec").drafts == 15472.0


def test_sums_over_engine_ranks() -> None:
    page = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 4.0\n'
    )
    assert parse_metrics(page).running == 7.0


@pytest.mark.parametrize(
    "garbage", ["vllm:num_requests_running{engine=0 nope\n", "vllm:num_requests_running abc\n"]
)
def test_garbage_raises_parse_error(garbage: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics(garbage)


def test_disabled_log_stats_page_is_all_unknown() -> None:
    s = parse_metrics("# TYPE python_info gauge\npython_info 1.0\n")
    assert not s.has_vllm_metrics and s.running is None and s.tpot_count is None


def _later(page: str) -> str:
    page = bump(page, SPEC.format("drafts"), 15472.0, 16472.0)
    page = bump(page, SPEC.format("draft_tokens"), 61888.0, 65888.0)
    page = bump(page, SPEC.format("accepted_tokens"), 36458.0, 38458.0)
    for i, (old, add) in enumerate(
        zip((12413.0, 10081.0, 7763.0, 6201.0), (900, 600, 300, 200), strict=True)
    ):
        page = bump(page, POS.format(i), old, old + add)
    page = bump(page, TPOT.format("count"), 404.0, 414.0)
    page = bump(page, ITL.format("count"), 15472.0, 16472.0)
    page = bump(page, ITL.format("sum"), 1298.7125550100013, 1298.7125550100013 + 8.0)
    page = bump(page, GEN, 51712.0, 51712.0 + 3000.0)
    return bump(page, TPOT.format("sum"), 10.226083110314967, 10.226083110314967 + 0.25)


def test_window_deltas(spec_page: str) -> None:
    w = MetricsWindow(window_s=10.0)
    first = w.add(0.0, parse_metrics(spec_page))
    assert first.acceptance_rate is None and first.tpot_s is None  # one sample: no rate yet
    st = w.add(1.0, parse_metrics(_later(spec_page)))
    assert st.acceptance_rate == pytest.approx(2000 / 4000)
    assert st.mean_acceptance_length == pytest.approx(1 + 2000 / 1000)
    assert st.per_position == pytest.approx((0.9, 0.6, 0.3, 0.2))
    assert st.tpot_s == pytest.approx(0.025)
    assert st.step_s == pytest.approx(0.008)  # Δsum / Δcount of inter-token latency
    assert st.tokens_per_step == pytest.approx(3000 / (3000 - 2000))  # Δgen / (Δgen − Δaccepted)
    assert st.drafts == 1000.0


def test_prefill_rate_counts_prompt_tokens_not_served_from_the_cache(base_page: str) -> None:
    prompt = 'vllm:prompt_tokens_total{engine="0",model_name="qwen3-8b-base"}'
    cached = 'vllm:prompt_tokens_cached_total{engine="0",model_name="qwen3-8b-base"}'
    s = parse_metrics(base_page)
    assert (s.prompt_tokens, s.cached_tokens) == (389120.0, 0.0)
    w = MetricsWindow(window_s=10.0)
    assert w.add(0.0, s).prefill_tps is None  # one sample: no rate yet
    later = bump(bump(base_page, prompt, 389120.0, 389120.0 + 6000.0), cached, 0.0, 2000.0)
    assert w.add(2.0, parse_metrics(later)).prefill_tps == pytest.approx((6000 - 2000) / 2.0)


def test_preemptions_are_a_rate_over_the_window(base_page: str) -> None:
    """Each recompute preemption prefills its request's context again, which the prompt
    counter does not count: the router needs the rate to take that prefill out of a step."""
    name = 'vllm:num_preemptions_total{engine="0",model_name="qwen3-8b-base"}'
    s = parse_metrics(base_page)
    assert s.preemptions == 0.0
    w = MetricsWindow(window_s=10.0)
    assert w.add(0.0, s).preemptions_per_s is None
    st = w.add(4.0, parse_metrics(bump(base_page, name, 0.0, 30.0)))
    assert st.preemptions_per_s == pytest.approx(7.5)
    assert st.as_dict()["preemptions_per_s"] == pytest.approx(7.5)


def test_counter_reset_restarts_window(spec_page: str) -> None:
    w = MetricsWindow(window_s=10.0)
    w.add(0.0, parse_metrics(_later(spec_page)))
    st = w.add(1.0, parse_metrics(spec_page))  # counters went down: engine restarted
    assert st.resets == 1
    assert st.acceptance_rate is None  # window restarted from the new sample
    st = w.add(2.0, parse_metrics(_later(spec_page)))
    assert st.acceptance_rate == pytest.approx(0.5)


def test_window_forgets_old_samples(spec_page: str) -> None:
    w = MetricsWindow(window_s=5.0)
    w.add(0.0, parse_metrics(spec_page))
    w.add(1.0, parse_metrics(_later(spec_page)))
    st = w.add(20.0, parse_metrics(_later(spec_page)))  # nothing happened in the last window
    assert st.acceptance_rate is None and st.drafts == 0.0


def test_the_recent_part_of_a_window_is_its_last_seconds_alone() -> None:
    """An engine that just started running alone shows it in the last seconds of the
    window before the whole window is its own (``EngineStats.recent``)."""
    from gateway.engines.parse import MetricsSample

    w = MetricsWindow(window_s=10.0, recent_s=3.0)
    itl_sum = itl_count = gen = 0.0
    st = None
    for t in range(11):  # steps of 20 ms for 7 s, then of 10 ms
        step = 0.020 if t < 7 else 0.010  # the interval from t to t + 1
        st = w.add(float(t), MetricsSample(itl_sum=itl_sum, itl_count=itl_count, generation_tokens=gen))
        itl_sum, itl_count, gen = itl_sum + 64 * step * 100, itl_count + 64 * 100, gen + 6400
        if t <= 3:
            assert st.recent is None  # the window is no longer than its recent part
    assert st is not None and st.recent is not None
    assert st.recent.window_s == pytest.approx(3.0) and st.window_s == pytest.approx(10.0)
    assert st.recent.step_s == pytest.approx(0.010)  # t 7..10: the 10-ms steps only
    assert st.step_s == pytest.approx((7 * 0.020 + 3 * 0.010) / 10)
    assert st.recent.recent is None
    assert st.as_dict()["recent"]["step_s"] == pytest.approx(0.010)  # type: ignore[index]
