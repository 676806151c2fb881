"""The pure engine model: batching, prefill, finishing, aborts, determinism."""

from __future__ import annotations

import pytest

from gateway.physics import get_profile
from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineConfig
from specgate_lab.emulator.engine_types import StepEntry
from specgate_lab.emulator.spec import SpecConfigError, parse_spec_config
from specgate_lab.emulator.stepcost import price_step
from specgate_lab.emulator.textgen import PromptKind, classify
from tests.emulator.conftest import NGRAM5, run_all, run_sequential
from tests.emulator.prompts import CHATS, EDITS, SUMMARIES


def test_classify_prompts_by_what_they_ask() -> None:
    assert {classify(p) for p in EDITS} == {PromptKind.EDIT}
    assert {classify(p) for p in SUMMARIES} == {PromptKind.SUMMARY}
    assert {classify(p) for p in CHATS} == {PromptKind.CHAT}


def test_max_num_seqs_caps_the_batch_and_queues_the_rest() -> None:
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m", max_num_seqs=4)))
    reqs = [eng.make_request("hello", max_tokens=20, ignore_eos=True, seed=i) for i in range(10)]
    for r in reqs:
        dev.submit(eng, r, 0.0)
    # the first request started stepping at once; the next step admits up to the cap
    assert eng.num_running == 1 and eng.num_waiting == 9
    dev.run_until(dev.next_event_time() or 0.0)
    assert eng.num_running == 4 and eng.num_waiting == 6
    peak = 0
    while (t := dev.next_event_time()) is not None:
        dev.run_until(t)
        peak = max(peak, eng.num_running)
    assert peak == 4
    assert all(r.finish_reason == "length" and len(r.output) == 20 for r in reqs)
    # queued requests waited for a slot
    assert reqs[-1].scheduled_at is not None and reqs[-1].scheduled_at > 0


def test_step_time_follows_the_profile_and_prefill_costs_time() -> None:
    prof = get_profile("h200-qwen3-8b")
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m")))
    short = eng.make_request("hi", max_tokens=50, ignore_eos=True)
    run_sequential(dev, eng, [short])
    assert short.first_token_at is not None and short.finished_at is not None
    tpot = (short.finished_at - short.first_token_at) / 49
    assert tpot * 1e3 == pytest.approx(prof.step_ms(1, 1, short.num_prompt_tokens + 25), rel=0.05)
    long_prompt = " ".join(["word"] * 3000)
    long = eng.make_request(long_prompt, max_tokens=2, ignore_eos=True)
    t0 = dev.t
    run_sequential(dev, eng, [long], t0)
    assert long.first_token_at is not None
    assert long.first_token_at - t0 > (short.first_token_at - 0.0) + prof.prefill_ms(2500) / 1e3


def test_spec_cost_scale_scales_what_speculation_adds_and_nothing_else() -> None:
    """The knob that makes an engine's truth differ from the profile: verifying drafts and
    drafting cost ``spec_cost_scale`` × the profile's price; the plain step under it, and
    a step without speculation, are untouched."""
    prof = get_profile("h200-qwen3-8b")
    eng = Engine(EngineConfig("m"))
    entries = [StepEntry(eng.make_request("hello", max_tokens=8, seed=i)) for i in range(32)]
    ngram = parse_spec_config(NGRAM5)

    def step_ms(scale: float, spec: bool) -> float:
        plan = price_step(
            entries, profile=prof, spec=ngram if spec else None, k_now=5, n_dec=32,
            dec_tokens=32 * 6 if spec else 32, ctx_sum=32 * 1024, drafted_k=5 if spec else 0,
            overhead_ms=0.0, spec_cost_scale=scale,
        )  # fmt: skip
        return plan.duration_s * 1e3

    plain = step_ms(1.0, spec=False)
    assert step_ms(0.5, spec=False) == plain
    full, half, none = step_ms(1.0, True), step_ms(0.5, True), step_ms(0.0, True)
    assert none == pytest.approx(plain)  # nothing added: a plain step
    assert full > 1.2 * plain
    assert half - none == pytest.approx((full - none) / 2)


def test_sloped_scales_change_with_the_batch_and_equal_the_scale_at_eight() -> None:
    """A device that falls behind its profile as the batch grows, and a drafter whose excess
    shrinks with it (a real H100, round 16): each scale is times (batch ÷ 8) ** slope."""
    prof = get_profile("h200-qwen3-8b")
    eng = Engine(EngineConfig("m"))
    ngram = parse_spec_config(NGRAM5)

    def step_ms(batch: int, spec: bool, **kw: float) -> float:
        entries = [StepEntry(eng.make_request("hello", max_tokens=8, seed=i)) for i in range(batch)]
        plan = price_step(
            entries, profile=prof, spec=ngram if spec else None, k_now=5, n_dec=batch,
            dec_tokens=batch * (6 if spec else 1), ctx_sum=batch * 1024, drafted_k=5 if spec else 0,
            overhead_ms=0.0, **kw,
        )  # fmt: skip
        return plan.duration_s * 1e3

    for spec in (False, True):  # at a batch of 8 a slope changes nothing
        assert step_ms(8, spec, device_scale=1.2, device_scale_slope=0.5) == pytest.approx(
            step_ms(8, spec, device_scale=1.2)
        )
    assert step_ms(32, False, device_scale_slope=0.5) == pytest.approx(2.0 * step_ms(32, False))
    assert step_ms(32, False, spec_cost_slope=-0.5) == step_ms(32, False)  # plain: no spec cost
    base32, full32 = step_ms(32, False), step_ms(32, True)
    # (32 / 8) ** -0.5 = 0.5: what speculation adds costs half at 32
    assert step_ms(32, True, spec_cost_slope=-0.5) - base32 == pytest.approx((full32 - base32) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="spec_cost_slope"):
        EngineConfig("m", spec_cost_slope=1.5)


def test_long_prompts_are_prefilled_in_chunks() -> None:
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m", max_num_batched_tokens=512, max_model_len=8192)))
    req = eng.make_request(" ".join(["w"] * 2000), max_tokens=3, ignore_eos=True)
    dev.submit(eng, req, 0.0)
    run_all(dev)
    assert eng.stats.steps >= 4 + 2  # four prefill chunks, then decode steps
    assert eng.stats.prompt_tokens == req.num_prompt_tokens


def test_stop_strings_and_natural_stop() -> None:
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m")))
    free = eng.make_request(EDITS[0], max_tokens=4000, temperature=0.0)
    run_sequential(dev, eng, [free])
    assert free.finish_reason == "stop" and len(free.output) == free.gen.natural_length
    text = "".join(free.output)
    stop = text[40:46]
    cut = eng.make_request(EDITS[0], max_tokens=4000, temperature=0.0, stop=(stop,))
    run_sequential(dev, eng, [cut], dev.t)
    assert cut.finish_reason == "stop"
    assert "".join(cut.output) == text[: text.index(stop)]


def test_abort_frees_the_slot_and_counts() -> None:
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m", max_num_seqs=1)))
    a = eng.make_request("a", max_tokens=100, ignore_eos=True)
    b = eng.make_request("b", max_tokens=5, ignore_eos=True)
    dev.submit(eng, a, 0.0)
    dev.submit(eng, b, 0.0)
    assert eng.num_waiting == 1
    dev.run_until(0.02)
    dev.abort(eng, a, 0.02)
    assert a.finish_reason == "abort" and eng.stats.finished["abort"] == 1
    run_all(dev)
    assert b.finish_reason == "length" and len(a.output) < 100
    assert not dev.abort(eng, a, dev.t)  # already gone: nothing to do


def test_same_seed_same_answer_and_different_seeds_differ_at_t1() -> None:
    def answer(seed: int | None, temperature: float) -> str:
        dev = Device()
        eng = dev.attach(Engine(EngineConfig("m", spec=parse_spec_config(NGRAM5))))
        r = eng.make_request(SUMMARIES[0], max_tokens=80, temperature=temperature, seed=seed)
        run_sequential(dev, eng, [r])
        return "".join(r.output)

    assert answer(7, 1.0) == answer(7, 1.0)
    assert answer(7, 1.0) != answer(8, 1.0)
    assert answer(None, 0.0) == answer(None, 0.0)  # greedy is deterministic


def test_spec_counters_are_consistent() -> None:
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m", spec=parse_spec_config(NGRAM5))))
    reqs = [eng.make_request(p, max_tokens=200, temperature=0.0, seed=i) for i, p in enumerate(EDITS)]
    run_sequential(dev, eng, reqs)
    s = eng.stats
    assert s.num_drafts == sum(r.num_drafts for r in reqs) > 0
    assert s.num_accepted == sum(s.accepted_per_pos) <= s.num_draft_tokens <= 5 * s.num_drafts
    assert s.accepted_per_pos == sorted(s.accepted_per_pos, reverse=True)
    assert s.generation_tokens == sum(len(r.output) for r in reqs)
    summary = reqs[0].spec_summary()
    assert summary["num_drafts"] == reqs[0].num_drafts
    # tokens per step beats 1: that is the point of speculation
    assert s.generation_tokens / s.steps > 1.5


@pytest.mark.parametrize(
    "raw,err",
    [
        ('{"method":"ngram","num_speculative_tokens":5,"bogus":1}', "bogus"),
        ('{"method":"nope","num_speculative_tokens":5}', "method"),
        ('{"method":"ngram"}', "num_speculative_tokens"),
        ('{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":6,"prompt_lookup_max":3}', "min"),
        ('{"method":"eagle3","num_speculative_tokens":3,"rejection_sample_method":"synthetic"}', "synthetic"),
        ("[1,2]", "object"),
        ("{nope", "JSON"),
    ],
)
def test_speculative_config_errors(raw: str, err: str) -> None:
    with pytest.raises(SpecConfigError, match=err):
        parse_spec_config(raw)


def test_speculative_config_defaults() -> None:
    assert parse_spec_config(None) is None
    c = parse_spec_config('{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}')
    assert c is not None and (c.k, c.prompt_lookup_min, c.prompt_lookup_max, c.text_based) == (4, 4, 4, True)
    d = parse_spec_config('{"model":"Qwen/Qwen3-0.6B","num_speculative_tokens":3}')
    assert d is not None and d.method == "draft_model" and not d.text_based


def test_bulk_indexed_proposer_equals_incremental_one() -> None:
    import random

    from gateway.text import PromptLookupProposer
    from specgate_lab.emulator.engine import indexed_proposer

    rng = random.Random(1)
    for _ in range(200):
        toks = [rng.choice("abcde") for _ in range(rng.randrange(0, 60))]
        n_min = rng.randrange(1, 4)
        n_max = rng.randrange(n_min, 6)
        a = PromptLookupProposer(toks, k=4, n_min=n_min, n_max=n_max)
        b = indexed_proposer(toks, k=4, n_min=n_min, n_max=n_max)
        assert a.propose() == b.propose()
        for t in "abcabd":
            a.append(t)
            b.append(t)
            assert a.propose() == b.propose()


def test_kv_cache_pressure_preempts_and_recomputes_without_changing_answers() -> None:
    from specgate_lab.emulator.metrics import EngineMetrics

    def run(blocks: int) -> tuple[list[str], Engine, EngineMetrics]:
        cfg = EngineConfig("m", spec=parse_spec_config(NGRAM5), num_gpu_blocks=blocks)
        m = EngineMetrics("m", spec_k=5, max_model_len=4096)
        dev = Device()
        eng = dev.attach(Engine(cfg, observer=m))
        m.engine = eng
        reqs = [eng.make_request(EDITS[i % 3], max_tokens=300, ignore_eos=True, seed=i) for i in range(12)]
        for r in reqs:
            dev.submit(eng, r, 0.0)
        peak = 0.0
        while (t := dev.next_event_time()) is not None:
            dev.run_until(t)
            peak = max(peak, eng.kv_tokens() / (blocks * 16))
        assert peak <= 1.0
        assert all(r.finish_reason == "length" and len(r.output) == 300 for r in reqs)
        return ["".join(r.output) for r in reqs], eng, m

    roomy, eng_roomy, _ = run(100_000)
    tight, eng_tight, metrics = run(200)  # 3200 tokens: room for about 4 of the 12
    assert eng_roomy.stats.preemptions == 0
    assert eng_tight.stats.preemptions > 0
    assert tight == roomy  # recompute changes timing, never text
    assert "vllm:num_preemptions_total" in metrics.render().decode()
    assert eng_tight.stats.prompt_tokens == eng_roomy.stats.prompt_tokens  # prompts counted once


def test_a_request_moved_to_the_sibling_engine_continues_its_answer() -> None:
    """Released by plain mid-answer and adopted by the n-gram engine, a request prefills its
    prompt and the text generated so far there, then goes on with the very answer it was
    giving; the plain engine counts an abort and emits nothing more for it."""
    prompt = EDITS[0]

    def fresh() -> tuple[Device, Engine, Engine]:
        dev = Device()
        base = dev.attach(Engine(EngineConfig("m", seed=7)))
        spec = dev.attach(Engine(EngineConfig("m", seed=7, spec=parse_spec_config(NGRAM5))))
        return dev, base, spec

    dev, base, _ = fresh()
    alone = base.make_request(prompt, max_tokens=200, seed=3)
    run_sequential(dev, base, [alone])

    dev, base, spec = fresh()
    req = base.make_request(prompt, max_tokens=200, seed=3)
    dev.submit(base, req, 0.0)
    while len(req.output) < 40:
        dev.run_until(dev.next_event_time() or 0.0)
    moved_at, before = dev.t, len(req.output)
    dev.migrate(base, spec, req, dev.t)
    assert base.num_running == 0 and base.stats.finished["abort"] == 1
    assert req.recompute == before and req.prefilled == 0  # prompt + output to prefill
    run_all(dev)
    assert "".join(req.output) == "".join(alone.output) and req.finish_reason == alone.finish_reason
    assert spec.stats.steps > 0 and req.num_drafts > 0  # drafted from prompt + its own output
    # to vLLM the continuation is a new request: its whole prefill counts as prompt tokens
    assert spec.stats.prompt_tokens == len(req.prompt_tokens) + before
    assert req.last_token_at is not None and req.last_token_at > moved_at


def test_a_request_released_mid_step_gets_no_tokens_from_that_step() -> None:
    dev = Device()
    base = dev.attach(Engine(EngineConfig("m")))
    spec = dev.attach(Engine(EngineConfig("m", spec=parse_spec_config(NGRAM5))))
    req = base.make_request(EDITS[1], max_tokens=50, ignore_eos=True, seed=1)
    dev.submit(base, req, 0.0)
    dev.run_until(dev.next_event_time() or 0.0)
    assert dev.in_flight(base) is not None  # plain's next step, with the request in it, runs
    n = len(req.output)
    assert base.release(req)
    dev.run_until(dev.next_event_time() or 0.0)  # that step ends
    assert len(req.output) == n and req.finish_reason is None
    assert not base.release(req)  # no longer there
    spec.adopt(req, dev.t)
    assert spec.num_waiting == 1
