"""Step-time prior, regime cost model, evidence-driven mode flips and probing (the decision core's parts)."""

from __future__ import annotations

import math
import random

import pytest

from gateway.physics import get_profile
from gateway.routing.acceptance import KindLearner, ngram_prior, tokens_per_step
from gateway.routing.adaptive.costmodel import regime_costs
from gateway.routing.adaptive.mix import MixEntry, TrafficMix, change_point
from gateway.routing.adaptive.modes import ModeTracker
from gateway.routing.adaptive.overrides.probe import Prober
from gateway.routing.steptime import TableStepModel, get_step_model

# DESIGN §3 table (H200, Qwen3-8B, 1024 context): (batch, q) -> ms
H200 = {(1, 1): 5.52, (1, 6): 5.90, (32, 1): 6.65, (64, 6): 15.28, (256, 1): 19.80, (256, 6): 53.52}


@pytest.mark.parametrize(("bq", "ms"), list(H200.items()))
def test_builtin_table_and_profile_match_calibration(bq: tuple[int, int], ms: float) -> None:
    b, q = bq
    assert TableStepModel().step_ms(b, q) == pytest.approx(ms, rel=0.01)
    assert get_step_model("h200-qwen3-8b").step_ms(b, q) == pytest.approx(ms, rel=0.02)


def test_verification_is_nearly_free_at_batch_1_and_dear_at_256() -> None:
    m = TableStepModel()
    assert m.step_ms(1, 6) / m.step_ms(1, 1) < 1.1
    assert m.step_ms(256, 6) / m.step_ms(256, 1) > 2.5


def test_unknown_profile_falls_back_to_builtin_table() -> None:
    assert get_step_model("no-such-profile").step_ms(1, 1) == pytest.approx(5.52, rel=0.01)
    assert get_profile("h200-qwen3-8b") is not None


def test_expected_tokens_per_step() -> None:
    assert tokens_per_step([0.5, 0.4, 0.33]) == pytest.approx(1 + 0.5 + 0.2 + 0.066)
    assert tokens_per_step([1.0] * 5, p_draft=0.5) == pytest.approx(3.5)  # half the steps draft nothing
    hi, lo = ngram_prior(0.9, 0.0, 5)[0], ngram_prior(0.9, 1.0, 5)[0]
    assert hi > lo > ngram_prior(0.05, 0.0, 5)[0]  # falls with temperature and with overlap


def test_regime_costs_design_numbers() -> None:
    """AL 4.27, k=5: ~3.9x faster at batch 1, ~1.6x at 256; AL 1.2 is slower at 256."""
    m = TableStepModel()

    def speedup(b: int, e: float) -> float:
        # Bare verification cost (no host overhead) to compare with DESIGN §3's arithmetic.
        t_b, t_s = m.step_ms(b, 1), m.step_ms(b, 6)
        return t_b / (t_s / e)

    assert speedup(1, 4.27) == pytest.approx(4.0, rel=0.05)
    assert speedup(256, 4.27) == pytest.approx(1.58, rel=0.05)
    assert speedup(256, 1.2) < 0.5
    c = regime_costs(m, load=1, q_spec=6, inv_tokens_per_step=1 / 4.27, margin=0.05)
    assert c.speedup > 3.0
    assert c.break_even_tokens_per_step == pytest.approx(1.05 * c.spec_ms * 4.27 / c.base_ms, rel=1e-6)
    heavy = regime_costs(m, load=256, q_spec=6, inv_tokens_per_step=1 / 1.2)
    assert heavy.speedup < 1.0


def test_prefill_is_a_cost_both_regimes_share() -> None:
    """Long prompts at a large batch: the prefill each answer token carries is the same in
    either regime, so it adds to both and pulls the speed-up toward 1."""
    m = TableStepModel()
    bare = regime_costs(m, load=128, q_spec=3, inv_tokens_per_step=1 / 2.0, margin=0.1)
    long = regime_costs(m, load=128, q_spec=3, inv_tokens_per_step=1 / 2.0, margin=0.1, prefill_per_token=2.0)
    x = m.prefill_ms_per_token() * 128 * 2.0
    assert long.shared_ms == pytest.approx(x)
    assert long.base_ms == pytest.approx(bare.base_ms + x) and long.spec_ms == pytest.approx(bare.spec_ms + x)
    assert 1.0 < long.speedup < bare.speedup
    # At the break-even harmonic-mean E, spec is exactly 1 + margin faster.
    be = regime_costs(
        m, load=128, q_spec=3, inv_tokens_per_step=1 / long.break_even_tokens_per_step, prefill_per_token=2.0
    )
    assert be.speedup == pytest.approx(1.1, rel=1e-6)


def _flip_time(m: ModeTracker, speedup: float, t0: float, dt: float = 0.1) -> float:
    """Feed ``speedup`` every ``dt`` seconds from ``t0`` until the mode flips; the flip time."""
    start, t = m.speculating, t0
    while m.speculating == start:
        t += dt
        m.update(speedup, t)
        assert t - t0 < 1000, "never flipped"
    return t - t0


def test_mode_flips_on_evidence_fast_when_decisive_slow_near_break_even() -> None:
    # band 0.05 around 1.05: leaves speculation below 1.0, comes back above 1.1
    m = ModeTracker(margin=0.05, band=0.05, evidence=0.5)
    assert m.update(2.0, 0.0)  # starts where the first prediction says
    for i in range(1, 600):  # ten minutes inside the band: never flips
        m.update(1.0 + 0.09 * ((i % 7) / 6), i)
    assert m.speculating and m.flips == 0 and m.against == 0.0
    decisive = _flip_time(m, 0.5, 600.0)  # 0.5 below the band edge: 1 s of evidence
    assert not m.speculating and decisive == pytest.approx(1.0, abs=0.15)
    slow = _flip_time(m, 1.15, 700.0)  # 0.05 above the upper edge: 10 s
    assert m.speculating and slow == pytest.approx(10.0, abs=0.15) and m.flips == 2


def test_mode_evidence_decays_while_the_prediction_is_back_on_its_side() -> None:
    m = ModeTracker(margin=0.05, band=0.05, evidence=0.5)
    m.update(2.0, 0.0)
    m.update(0.8, 1.0)
    m.update(0.8, 2.0)  # 1 s at 0.2 below: 0.2 of the 0.5 needed
    assert m.against == pytest.approx(0.2)
    m.update(1.5, 3.0)  # one more second at 0.8, then back above the band
    m.update(1.5, 4.0)  # a second at 1.5: 0.5 back
    assert m.speculating and m.against == 0.0
    # a threshold given per update (the policy scales it by the mean request duration)
    m.update(0.0, 5.0)
    assert m.update(0.0, 5.25, evidence=0.6)  # 0.25 s × 1.0 below the edge: not yet
    assert not m.update(0.0, 5.5, evidence=0.4)  # 0.5 of evidence ≥ 0.4: flipped
    assert m.flips == 1 and m.against == 0.0


def test_a_steady_edge_inside_the_band_is_taken_after_persist_s() -> None:
    """In fallback, a prediction that stays above 1 + margin but inside the band (spec a
    steady few per cent faster) flips to spec after persist_s seconds above on balance;
    one that wanders around the margin does not, and on spec the band's lower edge keeps
    it there while the edge holds."""
    m = ModeTracker(margin=0.05, band=0.05, evidence=0.5, persist_s=30.0)
    m.update(0.9, 0.0)
    assert not m.speculating
    for i in range(1, 600):  # ten minutes alternating 1.02 / 1.08: on balance zero
        m.update(1.02 if i % 2 else 1.08, float(i))
    assert not m.speculating and m.flips == 0 and m.above_s <= 1.0
    t = 600.0
    while not m.update(1.08, t):  # steady 1.08: above 1.05, under the upper edge 1.1
        t += 1.0
    assert t - 600.0 == pytest.approx(31.0, abs=1.0) and m.against == 0.0
    for i in range(1, 300):  # on spec, 1.08 is inside the band: it stays
        m.update(1.08, t + i)
    assert m.speculating and m.flips == 1
    never = ModeTracker(margin=0.05, band=0.05, evidence=0.5)  # persist_s 0: the band holds
    never.update(0.9, 0.0)
    assert not any(never.update(1.08, float(i)) for i in range(1, 600))


def test_a_flip_waits_for_a_cheap_moment_but_not_forever() -> None:
    """Evidence enough to flip while the old engine runs a burst: the flip waits (its drain
    would slow more requests than usual), up to twice the evidence."""
    m = ModeTracker(margin=0.05, band=0.05, evidence=0.5)
    m.update(2.0, 0.0)
    m.update(0.5, 1.0)
    assert m.update(0.5, 2.0, cheap=False)  # 0.5 of evidence, but a burst: still speculating
    assert m.update(0.5, 2.5, cheap=False)  # 0.75
    assert not m.update(0.5, 3.0, cheap=True)  # a cheap moment: flipped
    m.update(2.0, 4.0)
    flipped_at = next(t for t in (4.5, 5.0, 5.5, 6.0, 6.5) if m.update(2.0, t, cheap=False))
    # 0.9 a second beyond the band's edge (1.1): twice the 0.5 is reached by 5.5, with no
    # cheap moment (a cheap one would have flipped at 4.6)
    assert flipped_at == 5.5


def test_the_band_widens_by_the_predictions_sampling_error() -> None:
    """A prediction that dips below the band's edge by less than its own sampling error
    (another window of the same traffic would have read it this far away) is no evidence:
    the same dips with a precise prediction flip the mode; a decisive change still does."""
    noisy = ModeTracker(margin=0.05, band=0.02, evidence=0.5)
    precise = ModeTracker(margin=0.05, band=0.02, evidence=0.5)
    for m, noise in ((noisy, 0.06), (precise, 0.0)):
        m.update(1.1, 0.0, noise=noise)
        for i in range(1, 300):  # at 0.98 two seconds in three: 0.05 below the bare edge
            m.update(0.98 if i % 3 else 1.1, float(i), noise=noise)
    assert noisy.speculating and noisy.flips == 0 and noisy.against == 0.0
    assert noisy.lower == pytest.approx(1.05 - 0.02 - 0.06)
    assert precise.flips > 0
    noisy.update(0.5, 300.0, noise=0.06)
    noisy.update(0.5, 301.5, noise=0.06)  # 1.5 s at 0.41 below the widened edge: 0.6 ≥ 0.5
    assert not noisy.speculating and noisy.upper == pytest.approx(1.05 + 0.02 + 0.06)


def test_the_mix_reports_its_sampling_error() -> None:
    mix = TrafficMix(window_s=10.0, min_requests=4)
    for i, e in enumerate((1.0, 3.0, 1.0, 3.0)):
        mix.add(MixEntry(float(i), ("chat", 0), prior_tokens_per_step=e, prior_verified=1.0))
    price = mix.priced(lambda m: (m.prior_tokens_per_step, m.prior_verified), 1.0, knowledge=0)
    # 1/E: 1, 1/3, 1, 1/3 -> mean 2/3, sample variance 4/27, standard error sqrt(4/27/4)
    assert price.mean_inverse_tokens_per_step == pytest.approx(2 / 3)
    assert price.inverse_se == pytest.approx((4 / 27 / 4) ** 0.5)
    same = TrafficMix(window_s=10.0, min_requests=4)
    for i in range(4):
        same.add(MixEntry(float(i), ("chat", 0), prior_tokens_per_step=2.0, prior_verified=1.0))
    assert same.priced(lambda m: (2.0, 1.0), 1.0, knowledge=0).inverse_se == 0.0


def test_the_mix_is_priced_with_what_is_known_now() -> None:
    """Requests already in the window are re-priced when their class is learned: a shift
    to an unseen temperature is not priced on the stale prior for a whole window."""
    mix = TrafficMix(window_s=10.0, min_requests=4)
    for i in range(6):
        mix.add(MixEntry(float(i), ("edit", 3), prior_tokens_per_step=3.0, prior_verified=2.0))
    learned = {"e": 3.0}

    def price(m: MixEntry) -> tuple[float, float]:
        return learned["e"], m.prior_verified

    before = mix.priced(price, 1.0, knowledge=0)
    assert before.mean_inverse_tokens_per_step == pytest.approx(1 / 3) and before.mean_verified == 2.0
    learned["e"] = 1.2  # answers of the class come back: E is 1.2, not 3
    assert mix.priced(price, 1.0, knowledge=0) == before  # memoised while knowledge holds
    after = mix.priced(price, 1.0, knowledge=1)
    assert after.mean_inverse_tokens_per_step == pytest.approx(1 / 1.2)
    halved = mix.priced(price, 0.5, knowledge=1)  # live ratio: E = 1 + (E - 1) · 0.5
    assert halved.mean_inverse_tokens_per_step == pytest.approx(1 / 1.1)
    assert TrafficMix(10.0, 4).priced(price, 1.0, 0).mean_verified is None


def test_pricing_by_class_prices_exactly_as_entry_by_entry() -> None:
    """The estimator's per-class pricing is the per-entry blend, bit for bit: the same
    prices, errors and change-point cuts as each request was priced alone, through new
    requests, new knowledge and new live ratios."""
    rng = random.Random(3)
    by_entry = TrafficMix(window_s=5.0, min_requests=8, change_z=4.0)
    by_class = TrafficMix(window_s=5.0, min_requests=8, change_z=4.0)
    taught: dict[tuple[str, int], tuple[float, float, float, float]] = {}

    def learned(klass: tuple[str, int]) -> tuple[float, float, float, float]:
        return taught.get(klass, (0.0, 1.0, 0.0, 1.0))

    def price(m: MixEntry) -> tuple[float, float]:
        w, e, wq, q = learned(m.klass)
        return (1.0 - w) * m.prior_tokens_per_step + w * e, (1.0 - wq) * m.prior_verified + wq * q

    cuts = 0
    for i in range(600):
        t = i * 0.05
        prior = rng.uniform(1.0, 1.3) if (i // 150) % 2 else rng.uniform(3.5, 4.0)  # shifts: cuts
        m = MixEntry(t, (rng.choice(("edit", "chat")), rng.randrange(4)), prior, rng.uniform(1.0, 3.0))
        by_entry.add(m)
        by_class.add(m)
        if i % 7 == 0:
            taught[m.klass] = (0.2 * rng.random(), rng.uniform(1.0, 4.0), rng.random(), rng.uniform(1.0, 3.0))
        ratio = round(rng.uniform(0.5, 1.2), 2)
        knowledge = i // 3
        a = by_entry.priced(price, ratio, knowledge)
        assert by_class.priced_by_class(learned, ratio, knowledge) == a
        assert list(by_class.entries) == list(by_entry.entries)
        cuts += len(by_class) < min(i + 1, 100)  # 5 s of 20 a second, unless a change cut it
    assert cuts > 0  # the change test ran on both and cut both alike


def test_a_change_of_traffic_ends_the_mix_window() -> None:
    """Copy-heavy edits (1/E ~0.3-0.45) give way to open chat (1/E = 1): three chats end
    the window, so the shift is priced on the chat alone, not on a window mean that
    crosses break-even only once most of it is chat."""
    edits = [0.30, 0.42, 0.36, 0.45, 0.33, 0.40, 0.38, 0.35, 0.41, 0.32]
    assert change_point([*edits, 1.0, 1.0, 1.0], 4.0) == len(edits)
    assert change_point([*edits, 1.0, 1.0], 4.0) == 0  # two are not enough
    assert change_point(edits[:5], 4.0) == 0  # nor a window too short to split
    assert change_point([*edits, 1.0, 1.0, 1.0], 0.0) > 0  # any split beats z = 0
    # a change shows first in the newest requests: the newest side is at most a third of
    # the window, and a split deep in it (12 of 16 new) is left to the window mean
    assert change_point([0.4] * 4 + [1.0] * 12, 4.0) == 0
    assert change_point([0.4] * 12 + [1.0] * 4, 4.0) == 12

    mix = TrafficMix(window_s=60.0, min_requests=4, change_z=4.0)
    for i, x in enumerate([*edits, 1.0, 1.0, 1.0]):
        mix.add(MixEntry(float(i), ("edit", 0), prior_tokens_per_step=1.0 / x, prior_verified=1.0))
    price = mix.priced(lambda m: (m.prior_tokens_per_step, m.prior_verified), 1.0, knowledge=0)
    assert price.mean_inverse_tokens_per_step == pytest.approx(1.0) and len(mix) == 3


def test_mixed_traffic_keeps_its_whole_window() -> None:
    """Stationary mixed traffic: three alike in a row (same class, same price) are chance,
    judged by the spread of the whole window, not by their own (none)."""
    rng = random.Random(7)
    xs = [1.0 if rng.random() < 0.4 else rng.uniform(0.3, 0.5) for _ in range(40)]
    assert change_point([*xs, 1.0, 1.0, 1.0], 4.0) == 0
    cuts = 0
    for _ in range(200):  # windows of 16 from a long stationary stream
        window = [1.0 if rng.random() < 0.4 else rng.uniform(0.3, 0.5) for _ in range(16)]
        cuts += change_point(window, 4.0) > 0
    assert cuts <= 10  # rare (~2 %), not never: an unlucky run of one class reads as a change


def test_prober_share_and_interval() -> None:
    p = Prober(share=0.05, interval_s=30.0, last_probe=0.0)
    probes = sum(p.should_probe(1.0 + i * 0.01) for i in range(1000))  # 10 s of traffic
    assert 40 <= probes <= 51
    q = Prober(share=0.0, interval_s=30.0, last_probe=0.0)
    fired = [t for t in range(100) if q.should_probe(float(t))]
    assert fired == [30, 60, 90]


def test_learner_blends_by_evidence_and_forgets() -> None:
    lr = KindLearner(("edit", "chat"), prior_weight=3.0, half_life_s=100.0)
    assert lr.blend("edit", 0.0, 4.0, 0.0) == (4.0, 0.0)
    for i in range(30):
        lr.observe("edit", 0.0, 0.5, float(i))
    e, w = lr.blend("edit", 0.0, 4.0, 30.0)
    assert w > 0.85 and e < 2.0
    _, w_later = lr.blend("edit", 0.0, 4.0, 1030.0)
    assert w_later < 0.1  # old evidence decays: the prior takes over again
    lr.observe("edit", 0.0, math.nan, 0.0)  # ignored


def test_builtin_table_is_the_physics_decode_grid_at_hundredths_of_a_ms() -> None:
    """The fallback reads the calibration data of gateway.physics; its numbers are unchanged."""
    from gateway.physics import decode_grid

    m, g = TableStepModel(), decode_grid("qwen3-8b", 1024)
    assert (m.batches, m.qs) == (g.batches, g.qs)
    assert m.table == tuple(tuple(round(ms, 2) for ms in row) for row in g.ms)
    # The values the built-in copy carried, bit for bit.
    assert (m.table[0][0], m.table[5][5], m.table[8][6]) == (5.52, 8.90, 67.13)
    assert (m.step_ms(1, 1), m.step_ms(256, 8)) == (5.52, 67.13)


def test_a_persisting_edge_waits_for_a_cheap_moment_but_not_forever() -> None:
    """A steady edge that would flip after persist_s while the old engine queues (moving it
    would re-prefill a batch and re-send its queue) waits for a cheap moment, up to twice
    persist_s; once cheap, it flips at once."""
    m = ModeTracker(margin=0.05, band=0.05, evidence=0.5, persist_s=30.0)
    m.update(0.9, 0.0)
    t = 0.0
    while not m.update(1.08, t + 1.0, cheap=False):
        t += 1.0
    assert t + 1.0 == pytest.approx(61.0, abs=1.0)  # twice persist_s
    waited = ModeTracker(margin=0.05, band=0.05, evidence=0.5, persist_s=30.0)
    waited.update(0.9, 0.0)
    assert not any(waited.update(1.08, float(i), cheap=False) for i in range(1, 45))
    assert waited.update(1.08, 45.0, cheap=True) and waited.flips == 1
