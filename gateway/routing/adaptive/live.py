"""Live corrections of the cost model from the engines' scraped ``/metrics`` windows.

Multiplicative, 1 = the model is right:

* ``ratio``: the spec engine's windowed acceptance (tokens per step, else mean acceptance
  length) ÷ what the router expected of the traffic it sent there;
* ``q_ratio``: its drafted tokens per step ÷ expected (n-gram drafts only on a match);
* ``scale_spec`` / ``scale_base``: measured step time (windowed inter-token latency) ÷ the
  profile's, fitted only while the engine ran alone on the device (for the scrape window,
  or for the window's recent part just after the other engine stopped), per load; the
  part of it common to both engines (the device) is read from either (:mod:`.stepscale`).

With nothing measured (the engine idle, its scrape stale) each relaxes back to 1 on
``unknown_half_life_s``. The per-request check of the whole model against measured time
per token is :mod:`gateway.routing.adaptive.calibration`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.routing.adaptive.knobs import MS_PER_S, knob
from gateway.routing.adaptive.stepscale import StepScales
from gateway.routing.steptime import StepModel
from gateway.routing.types import EngineStats, EngineView, PairView


@dataclass(frozen=True, slots=True)
class LiveKnobs:
    fit_window_s: float = knob(10.0, "s", "the scraper's window (what a scraped step time is averaged over)")
    sent_horizon_s: float = knob(
        120.0, "s", "requests sent to spec are remembered this long (bounds the memory)"
    )
    max_sent: int = knob(4096, "requests", "bounds the memory of requests sent to spec and of predictions")
    min_cap: float = knob(
        32.0, "requests", "a smaller batch with a queue is the prefill budget or KV at work, not the cap"
    )
    cap_half_life_s: float = knob(
        10.0, "s", "the batch cap follows what saturated engines run over a few scrapes"
    )
    cap_queue: float = knob(
        0.25, "share of the batch", "a queue this long means the engine is full (shorter: its prefill budget)"
    )
    max_prefill_share: float = knob(
        0.9, "share of a step", "a measured prefill share above this is a window artefact"
    )
    scrape_lag_s: float = knob(
        1.0, "s", "the scraped running count lags by up to a scrape interval, at least this"
    )
    recent_min_tokens: float = knob(
        200.0, "tokens", "a recent part of a window shorter than this is too noisy to fit"
    )
    min_fit_points: int = knob(3, "decisions", "a fit needs the load at a few decisions of the window")
    min_duration_s: float = knob(0.05, "s", "guards the weight of a request whose duration is not known yet")
    min_draft_chance: float = knob(
        0.05, "probability", "guards the acceptance length of requests that rarely draft"
    )
    ratio_clip: tuple[float, float] = knob(
        (0.05, 1.5), "x expected", "a live acceptance ratio outside is a window artefact"
    )
    draft_ratio_clip: tuple[float, float] = knob(
        (0.05, 4.0), "x expected", "drafts vary more than acceptance (n-gram: on a match)"
    )
    tokens_guard: float = knob(
        0.02, "tokens per step", "expected acceptance this close to none gives no usable ratio"
    )


class _Predicted(NamedTuple):
    """The profile's prediction at a decision, kept over the scrape window."""

    at: float
    spec_load: float
    base_load: float
    spec_ms: float
    base_ms: float


# per engine (True: spec), the columns of _Predicted: its load, the other's, its predicted step
_COLUMNS = {True: (1, 2, 3), False: (2, 1, 4)}


def engine_load(e: EngineView) -> float:
    """Requests on an engine: the gateway's exact in-flight count, or the scrape if higher."""
    return e.load


def _decode_ms(stats: EngineStats, steps: StepModel, context_tokens: float, max_share: float) -> float:
    """The decode part of an engine's measured step, in ms.

    Steps also prefill the prompts of requests being admitted, and the profile prices
    decoding only. An engine that completes requests faster admits more of them per step,
    so its steps carry more prefill (a speculative engine's about E times the plain
    one's): left in, it would read as that engine's steps being slow, and a regime priced
    on it would lose to one that was not measured. Over a window, prefill takes
    ``prefill_tps`` x the per-token cost of the engine's time; the rest is decoding.

    An engine whose KV cache is full also preempts: each preempted request is prefilled
    again, its whole context (about the batch's mean, ``context_tokens``), and the prompt
    counter does not count that. On a saturated pair it was a third of the prefill.
    """
    step_ms = (stats.step_s or 0.0) * MS_PER_S
    tps = (stats.prefill_tps or 0.0) + (stats.preemptions_per_s or 0.0) * context_tokens
    share = tps * steps.prefill_ms_per_token() / MS_PER_S
    return step_ms * (1.0 - min(max_share, share))


def toward(old: float, new: float, dt: float, half_life: float) -> float:
    a = 1.0 - 0.5 ** (max(0.0, dt) / half_life) if half_life > 0 else 1.0
    return old + a * (new - old)


@dataclass
class LiveCorrections:
    half_life_s: float = 1.0
    unknown_half_life_s: float = 60.0
    fit_step_times: bool = True
    knobs: LiveKnobs = field(default_factory=LiveKnobs)
    ratio: float = 1.0
    raw_ratio: float | None = None  # the latest window's, unsmoothed (None: none yet)
    q_ratio: float = 1.0
    # measured ÷ profile step time, per engine and load (:mod:`.stepscale`)
    scales: StepScales = field(default_factory=StepScales)
    last_load: float = 1.0  # the load the scales are read at by scale_spec / scale_base
    prefill_per_token: float = 0.0  # prompt tokens prefilled per answer token (the pair's)
    last_update: float = -math.inf
    # The batch an engine runs while requests wait: its scheduler's cap (max_num_seqs, or
    # what its KV cache holds, which moves with the prompts). Requests beyond it queue;
    # they do not make steps longer. Smoothed over the recent saturated scrapes: a KV-bound
    # batch fluctuates, and its largest value would price every step too dear.
    batch_cap: float = math.inf
    # Requests sent to the spec engine: (time, 1/E, AL over drafted steps, tokens verified).
    _sent: deque[tuple[float, float, float, float]] = field(default_factory=deque)
    _last_view_key: tuple[object, ...] | None = None
    # each engine's newest scrape time, and the shortest gap seen between two scrapes (the
    # scrape interval: how late a scraped running count may show the other engine stopped)
    _scraped_at: dict[bool, float] = field(default_factory=dict)
    _scrape_gap: float = math.inf
    # the profile's predictions over the last window
    _pred_hist: deque[_Predicted] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._sent = deque(maxlen=self.knobs.max_sent)
        self._pred_hist = deque(maxlen=self.knobs.max_sent)

    @property
    def measured(self) -> bool:
        """Whether a live acceptance was ever measured."""
        return self.raw_ratio is not None

    def track_expected(self, now: float, blended: float, p_draft: float, q: float) -> None:
        """Record what the router expects of a request it sends to the spec engine.

        The engine's windowed acceptance is compared with the expectation of the requests
        that ran in the same window (see :meth:`_expected`), so a change of traffic is not
        read as a change of acceptance.
        """
        al = 1.0 + (blended - 1.0) / max(p_draft, self.knobs.min_draft_chance)
        sent = self._sent
        sent.append((now, 1.0 / blended, al, q))
        while sent and sent[0][0] < now - self.knobs.sent_horizon_s:
            sent.popleft()

    def _expected(self, stats: EngineStats, duration_s: float) -> tuple[float, float, float] | None:
        """(mean 1/E, mean AL over drafted steps, mean drafts verified) expected of the
        requests that ran on the spec engine during its scraped window.

        A request sent at t runs about one mean request duration; it is weighted by how
        much of [t, t + duration] falls in the window. The engine's tokens per step over a
        window is Σn / Σ(n/E): for answers of similar length, the *harmonic* mean of E, so
        the expectation is kept as a mean of 1/E.
        """
        end = stats.at if stats.at > 0 else self.last_update
        start = end - (stats.window_s if stats.window_s > 0 else self.knobs.fit_window_s)
        d = max(duration_s, self.knobs.min_duration_s)
        w_sum = inv = al = q = 0.0
        for t, i, a, v in reversed(self._sent):
            if t + d < start:
                break
            w = min(end, t + d) - max(start, t)
            if w > 0:
                w_sum += w
                inv += w * i
                al += w * a
                q += w * v
        if w_sum <= 0:
            return None
        return inv / w_sum, al / w_sum, q / w_sum

    def batch(self, load: float) -> float:
        """The batch ``load`` requests make on one engine (its cap, once one was seen)."""
        return min(load, self.batch_cap)

    def running(self, e: EngineView) -> float:
        """The batch an engine steps: its scraped running count where known, else its load
        at the batch cap."""
        running = e.stats.running
        if not e.stale and running is not None and running > 0:
            return float(running)
        return self.batch(engine_load(e))

    def refresh(
        self,
        pair: PairView,
        now: float,
        steps: StepModel,
        q_mix: float,
        method: str,
        k: int,
        duration_s: float = 2.0,
        context_tokens: float = 1024.0,
    ) -> None:
        """Fold the pair's latest scraped views in (once per decision); ``context_tokens``:
        the mean context of the sequences the engines decode."""
        dt = now - self.last_update if math.isfinite(self.last_update) else 0.0
        self.last_update = now
        kn = self.knobs
        spec, base = pair.speculative, pair.base
        for e in (spec, base):
            running, waiting = e.stats.running or 0.0, e.stats.waiting or 0.0
            if e.stale or running <= 0:
                continue
            if running >= kn.min_cap and waiting >= kn.cap_queue * running:  # full: the cap
                if math.isinf(self.batch_cap):
                    self.batch_cap = running
                else:
                    self.batch_cap = toward(self.batch_cap, running, dt, kn.cap_half_life_s)
            elif running > self.batch_cap:
                self.batch_cap = running  # not full, and it runs that many: the cap is higher
        expected = None if spec.stale else self._expected(spec.stats, duration_s)
        raw = self._live_acceptance_ratio(spec, expected)
        if raw is not None:
            hl = self.half_life_s
            self.ratio = toward(self.ratio, raw, dt, hl)
            self.raw_ratio = raw
        else:
            self.ratio = toward(self.ratio, 1.0, dt, self.unknown_half_life_s)
        q_raw = self._live_q_ratio(spec, expected)
        if q_raw is not None:
            self.q_ratio = toward(self.q_ratio, q_raw, dt, self.half_life_s)
        else:
            self.q_ratio = toward(self.q_ratio, 1.0, dt, self.unknown_half_life_s)
        prefill = [e.stats for e in (spec, base) if not e.stale and e.stats.prefill_tps is not None]
        gen = sum(st.generation_tps or 0.0 for st in prefill)
        if gen > 0:
            ratio = sum(st.prefill_tps or 0.0 for st in prefill) / gen
            self.prefill_per_token = toward(self.prefill_per_token, ratio, dt, self.half_life_s)
        if self.fit_step_times:
            self._fit_steps(spec, base, now, steps, q_mix, method, k, context_tokens)

    def _live_acceptance_ratio(
        self, spec: EngineView, expected: tuple[float, float, float] | None
    ) -> float | None:
        """Live acceptance of the spec engine ÷ what the router expected of its traffic."""
        if spec.stale or expected is None:
            return None
        exp_inv, exp_al, _ = expected
        (lo, hi), guard = self.knobs.ratio_clip, self.knobs.tokens_guard
        tps = spec.stats.tokens_per_step
        if tps is not None and exp_inv < 1.0 - guard:
            return min(hi, max(lo, (tps - 1.0) / (1.0 / exp_inv - 1.0)))
        al = spec.stats.mean_acceptance_length
        if al is not None and exp_al > 1.0 + guard:
            return min(hi, max(lo, (al - 1.0) / (exp_al - 1.0)))
        return None

    def _live_q_ratio(self, spec: EngineView, expected: tuple[float, float, float] | None) -> float | None:
        """Drafted tokens per step measured on the spec engine ÷ expected of its traffic.

        From the counters: accepted/step = E − 1 and accepted/draft token = rate, so draft
        tokens/step = (E − 1) / rate.
        """
        tps, rate = spec.stats.tokens_per_step, spec.stats.acceptance_rate
        if spec.stale or expected is None or tps is None or not rate or rate <= 0:
            return None
        verified = expected[-1]
        if verified <= 1.0 + self.knobs.tokens_guard:
            return None
        drafted = (tps - 1.0) / rate
        lo, hi = self.knobs.draft_ratio_clip
        return min(hi, max(lo, drafted / (verified - 1.0)))

    def _fit_steps(
        self,
        spec: EngineView,
        base: EngineView,
        now: float,
        steps: StepModel,
        q_mix: float,
        method: str,
        k: int,
        context_tokens: float,
    ) -> None:
        """Scale the profile by measured step time (windowed inter-token latency) ÷ predicted.

        The measured cycle is free of acceptance (one emission per step), so this corrects
        step times only. The scraped value is a mean over the last window, weighted by
        emissions (a step of batch B counts B times), so it is compared with the same
        load-weighted mean of what the profile predicted over that window. Only windows in
        which the engine ran alone on the device are used: with both engines stepping,
        how the device interleaves them blurs the attribution. An engine alone for less
        than the window (the other just stopped: a flip) is fitted on the window's recent
        part (:attr:`EngineStats.recent`) once that part lies after the other stopped, so a
        flip measures the new engine within seconds rather than a whole window later.
        The steps' prefill is taken out first (see :func:`_decode_ms`). Fitted once per new scrape, on a
        fractional power (smoothing).
        """
        for is_spec, e in ((True, spec), (False, base)):
            at, last = e.stats.at, self._scraped_at.get(is_spec)
            if at > 0 and last is not None and at > last:
                self._scrape_gap = min(self._scrape_gap, at - last)
            if at > 0:
                self._scraped_at[is_spec] = at
        kn = self.knobs
        lag = max(kn.scrape_lag_s, self._scrape_gap if math.isfinite(self._scrape_gap) else 0.0)
        l_s, l_b = self.running(spec), self.running(base)
        hist = self._pred_hist
        t_s = steps.step_ms(max(l_s, 1.0), q_mix) + steps.spec_extra_ms(method, k, max(l_s, 1.0))
        t_b = steps.step_ms(max(l_b, 1.0), 1.0)
        hist.append(_Predicted(now, l_s, l_b, t_s, t_b))
        while hist and hist[0].at < now - kn.fit_window_s:
            hist.popleft()
        key = (spec.stats.step_s, base.stats.step_s)
        if key == self._last_view_key or len(hist) < kn.min_fit_points:
            return
        self._last_view_key = key
        for spec_engine, e in ((True, spec), (False, base)):
            if e.stale:
                continue

            mine, theirs, predicted = _COLUMNS[spec_engine]
            # how long the engine has run alone (within the window kept)
            alone_since = hist[0].at
            for h in hist:
                if h[theirs] != 0 or h[mine] <= 0:
                    alone_since = math.inf
                elif alone_since == math.inf:
                    alone_since = h.at
            stats: EngineStats | None = e.stats
            if alone_since > hist[0].at:  # not for the whole window: its recent part, if alone
                stats = e.stats.recent
                if (
                    stats is None
                    or now - alone_since < stats.window_s + lag
                    or (stats.generation_tps or 0.0) * stats.window_s < kn.recent_min_tokens
                ):
                    continue
            if stats is None or not stats.step_s:
                continue
            part = [h for h in hist if h.at >= now - stats.window_s] or [hist[-1]]
            w = sum(h[mine] for h in part)
            pred = sum(h[mine] * h[predicted] for h in part) / w  # the profile's, load-weighted
            load = sum(h[mine] * h[mine] for h in part) / w
            ratio = _decode_ms(stats, steps, context_tokens, kn.max_prefill_share) / pred
            self.scales.observe(spec_engine, load, ratio, now)
            self.last_load = load

    def scale(self, spec: bool, load: float) -> float:
        """Measured ÷ profile step time of an engine at ``load`` (:mod:`.stepscale`)."""
        return self.scales.scale(spec, load, self.last_update)

    @property
    def scale_spec(self) -> float:
        return self.scale(True, self.last_load)

    @property
    def scale_base(self) -> float:
        return self.scale(False, self.last_load)
