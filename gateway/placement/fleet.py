"""One model's pairs behind one gateway: a regime per pair, one learning, placement.

:class:`FleetPolicy` holds one :class:`~gateway.routing.adaptive.AdaptivePolicy` per pair,
built from the existing parts. What is a property of the model and the traffic (acceptance
per class and temperature, drafts per class) is learned once, shared by all of them (and
the traffic's context, which the step-time profile is read at); what is a property of a
pair (its load, its device's measured step times, its regime and evidence, its handover and
quiet-pair state) stays in that pair's policy.

Per request, on a model with more than one pair:

1. the **planner** (:mod:`.planner`, every ``replan_s``) sets how many pairs speculate; the
   pairs that already do are kept, the least-loaded plain ones flip first, and each pair's
   policy follows its regime (``follow_leader``: the fleet is the pair's leader);
2. the request goes to the pair with the lowest **marginal cost** (:mod:`.prices`): its own
   time per token there plus what it adds to the requests already there; a conversation
   (``RequestFeatures.affinity``) stays on its last pair while that costs at most
   ``stick`` more than the best;
3. the chosen pair's policy decides the engine (hard rules, quiet pair, handover, regime).

With one pair, every call goes to the first policy unchanged: the decisions are today's.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from gateway.physics.methods import NGRAM_METHODS
from gateway.placement.planner import Planner
from gateway.placement.prices import PairPrices
from gateway.routing.acceptance import ngram_prior, prior_tokens_per_step
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.adaptive.live import engine_load
from gateway.routing.rules import NoEngineAvailable, choose_pair
from gateway.routing.types import (
    Decision,
    ModelView,
    Outcome,
    PairView,
    RequestFeatures,
    Route,
    RouteOverride,
)


@dataclass(frozen=True, slots=True)
class FleetKnobs:
    replan_s: float = 1.0  # s between plans of the number of speculating pairs
    stick: float = 0.05  # a conversation stays on its pair while it costs at most this much more
    affinities: int = 65536  # conversations remembered (least recently seen forgotten)
    hysteresis: float = 0.02  # a new plan must be this much cheaper than the current one
    min_dwell_s: float = 5.0  # a pair keeps a regime the fleet gave it at least this long
    impact: float = 0.0  # weight of what a request does to the others on its pair (:mod:`.prices`;
    # the full weight, 1, measured worse in the simulator: docs/fleet.md)


@dataclass(slots=True)
class _Pair:
    """What placement reads of a pair per request (kept by pair key)."""

    policy: AdaptivePolicy
    prices: PairPrices
    foreign: int = 0  # requests on the pair beyond this gateway's (the last scrape's)


def pair_key(pair: PairView) -> str:
    """A pair's identity across views: its plain engine's name."""
    return pair.base.name


class FleetPolicy:
    """The model's policy over all its pairs (module doc)."""

    name = "adaptive"

    def __init__(self, primary: AdaptivePolicy, knobs: FleetKnobs | None = None) -> None:
        self.knobs = knobs or FleetKnobs()
        self.primary = primary
        self.cfg = primary.cfg
        self.pairs: dict[str, AdaptivePolicy] = {}
        self.prices: dict[str, PairPrices] = {}
        self.state: dict[str, _Pair] = {}
        self.engine_pair: dict[str, str] = {}
        self.planner = Planner(hysteresis=self.knobs.hysteresis)
        self.affinity: OrderedDict[int, str] = OrderedDict()
        self.flipped_at: dict[str, float] = {}
        self.bound: tuple[str | None, int] | None = None
        self.fleet = False  # whether the fleet leads the pairs' regimes (more than one pair)
        self._next_plan = float("-inf")
        self.moves: list[str] = []  # engines whose streams the caller should move (fleet flips)
        self.placed = 0
        self.planned: int | None = None  # the planner's last count of speculating pairs

    # -- the pairs' policies -----------------------------------------------------------
    def policy_of(self, pair: PairView) -> AdaptivePolicy:
        key = pair_key(pair)
        pol = self.pairs.get(key)
        if pol is None:
            pol = self.primary if not self.pairs else self._new_policy()
            self.pairs[key] = pol
            self.prices[key] = PairPrices(pol.estimator, cap=self.cfg_cap(), impact=self.knobs.impact)
            self.state[key] = _Pair(pol, self.prices[key])
            for e in pair.engines:
                self.engine_pair[e.name] = key
        return pol

    def cfg_cap(self) -> int:
        return 256

    def _new_policy(self) -> AdaptivePolicy:
        """A new pair's policy: its own parts, the model's learners (it starts from them)."""
        pol = AdaptivePolicy(self.cfg)
        shared = self.primary.estimator
        pol.estimator.learner = shared.learner
        pol.estimator.draft_learner = shared.draft_learner
        pol.estimator.context = shared.context  # the traffic's context (the profile is read at it)
        pol.estimator.steps = shared.steps
        if self.bound is not None:
            pol.bind(*self.bound)
        return pol

    def forget(self, key: str) -> None:
        """A pair left the model (``PairsChanged.gone``): its state goes with it."""
        pol = self.pairs.pop(key, None)
        self.prices.pop(key, None)
        self.state.pop(key, None)
        self.flipped_at.pop(key, None)
        for e in [e for e, k in self.engine_pair.items() if k == key]:
            del self.engine_pair[e]
        for conv in [c for c, k in self.affinity.items() if k == key]:
            del self.affinity[conv]
        if pol is self.primary and self.pairs:  # another pair's policy speaks for the model
            self.primary = next(iter(self.pairs.values()))  # (the learners are the same objects)

    # -- the decision ------------------------------------------------------------------
    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        if len(view.pairs) == 1:
            if self.fleet:  # back to one pair: it decides its regime alone again
                self.fleet = False
                self.policy_of(view.pairs[0]).follow_leader(None, now)
            return self.policy_of(view.pairs[0]).decide(features, view, now)
        self.fleet = True
        if now >= self._next_plan:
            self._replan(view.pairs, now)
        pair = self._place(features, view.pairs, view.pinned, now)
        if pair is None:
            raise NoEngineAvailable(view.model, "all engines down")
        return self.pairs[pair.base.name].decide(features, ModelView(view.model, (pair,), view.pinned), now)

    def tokens_per_step(self, f: RequestFeatures, now: float) -> tuple[float, float]:
        """The request's tokens per spec step and verified tokens, from the model's learning."""
        est = self.primary.estimator
        k, method = est.k, est.method
        override = self.cfg.prior_tokens_per_step.get(method)
        if method in NGRAM_METHODS:
            prior, p_draft = ngram_prior(f.overlap, f.temperature, k)
            q = 1.0 + p_draft * k
        else:
            prior, q = prior_tokens_per_step(method, f.overlap, f.temperature, k), float(k + 1)
        if override is not None:
            prior = override
        kind = f.kind if f.kind in est.learner.kinds else "chat"
        e, _ = est.learner.blend(kind, f.temperature, prior, now)
        return e, q

    def _speculating(self, pair: PairView) -> bool:
        """The regime a pair runs for placement: its policy's, unless an engine is down."""
        if pair.spec is None or not pair.spec.usable:
            return False
        if not pair.base.usable:
            return True
        return self.pairs[pair_key(pair)].controller.speculating

    def _place(
        self, f: RequestFeatures, pairs: tuple[PairView, ...], pinned: RouteOverride, now: float
    ) -> PairView | None:
        """The usable pair with the lowest marginal cost for the request (module doc); one
        pass over the pairs, a few reads each (the decision's cost grows with the fleet)."""
        if pinned is not RouteOverride.AUTO or f.forced is not None:  # an operator's or client's route
            usable = tuple(p for p in pairs if any(e.usable for e in p.engines))
            return choose_pair(ModelView("", usable)) if usable else None
        e, q = self.tokens_per_step(f, now)
        self.planner.note(now, e, q)
        needs_base = bool(f.refused_params)
        state = self.state
        best: PairView | None = None
        best_cost = math.inf
        for p in pairs:
            b, sp = p.base, p.spec
            st = state.get(b.name)
            if st is None:
                self.policy_of(p)
                st = state[b.name]
            b_ok = b.healthy and not b.draining
            s_ok = sp is not None and sp.healthy and not sp.draining
            if not (b_ok or s_ok):
                continue
            i = b.inflight + st.foreign + (sp.inflight if sp is not None else 0)
            if s_ok and (not b_ok or st.policy.controller.speculating):
                if needs_base:  # it needs the plain engine: it would split a speculating pair
                    c = 2.0 * self._cost(st, False, i)
                else:
                    table = st.prices.tables[0]
                    c = table[i] if i < len(table) else st.prices.extend(True, i)
                    c /= 1.0 + (e - 1.0) * st.prices.ratio  # E >= 1: never below 1
            else:
                table = st.prices.tables[1]
                c = table[i] if i < len(table) else st.prices.extend(False, i)
            if c < best_cost:
                best, best_cost = p, c
        conv = f.affinity
        if conv and best is not None:
            last = self.affinity.get(conv)
            if last is not None and last != best.base.name:
                held = next((p for p in pairs if p.base.name == last), None)
                if held is not None and self._pair_cost(held, e, needs_base) <= best_cost * (
                    1.0 + self.knobs.stick
                ):
                    best = held
            self.affinity[conv] = best.base.name
            self.affinity.move_to_end(conv)
            if len(self.affinity) > self.knobs.affinities:
                self.affinity.popitem(last=False)
        self.placed += 1
        return best

    def _cost(self, st: _Pair, spec: bool, load: int) -> float:
        table = st.prices.tables[0 if spec else 1]
        return table[load] if load < len(table) else st.prices.extend(spec, load)

    def _pair_cost(self, p: PairView, e: float, needs_base: bool) -> float:
        """The request's cost on ``p`` (as :meth:`_place` prices it; inf: not usable)."""
        st = self.state.get(p.base.name)
        b_ok, s_ok = p.base.usable, p.spec is not None and p.spec.usable
        if st is None or not (b_ok or s_ok):
            return math.inf
        i = p.base.inflight + st.foreign + (p.spec.inflight if p.spec is not None else 0)
        if s_ok and (not b_ok or st.policy.controller.speculating):
            if needs_base:
                return 2.0 * self._cost(st, False, i)
            return self._cost(st, True, i) / (1.0 + (e - 1.0) * st.prices.ratio)
        return self._cost(st, False, i)

    def _replan(self, pairs: tuple[PairView, ...], now: float) -> None:
        """Refresh the pairs' prices; set how many pairs speculate (:mod:`.planner`)."""
        self._next_plan = now + self.knobs.replan_s
        usable = [p for p in pairs if any(e.usable for e in p.engines)]
        for p in usable:
            self.policy_of(p)
            st = self.state[pair_key(p)]
            st.prices.refresh()
            st.foreign = round(max(0.0, sum(engine_load(x) - x.inflight for x in p.engines)))
        able = [p for p in usable if p.spec is not None and p.spec.usable and p.base.usable]
        if not able:
            return
        ref = self.prices[pair_key(able[0])]
        current = sum(1 for p in able if self.pairs[pair_key(p)].controller.speculating)
        plan = self.planner.plan(now, len(able), current, ref.step_ms, ref.cap)
        if plan is None:
            return
        self.planned = plan.speculating
        load = {pair_key(p): sum(engine_load(x) for x in p.engines) for p in able}
        on = [p for p in able if self.pairs[pair_key(p)].controller.speculating]
        off = [p for p in able if not self.pairs[pair_key(p)].controller.speculating]
        on.sort(key=lambda p: -load[pair_key(p)])  # keep the busiest speculating pairs
        off.sort(key=lambda p: load[pair_key(p)])  # flip the least-loaded plain pairs first
        chosen = on[: plan.speculating] + off[: max(0, plan.speculating - len(on))]
        want = {pair_key(p) for p in chosen}
        for p in able:
            key = pair_key(p)
            pol = self.pairs[key]
            spec = key in want
            was = pol.controller.speculating
            if spec != was and now - self.flipped_at.get(key, float("-inf")) < self.knobs.min_dwell_s:
                spec = was
            if spec != was:
                self.flipped_at[key] = now
            moved = pol.follow_leader(spec, now)
            if moved is not None:
                old = p.speculative if moved is Route.SPEC else p.base
                self.moves.append(old.name)

    def take_moves(self) -> list[str]:
        """Engines whose streams move to their sibling after fleet flips (then forgotten)."""
        out, self.moves = self.moves, []
        return out

    # -- learning ----------------------------------------------------------------------
    def bind(self, method: str | None, k: int) -> None:
        self.bound = (method, k)
        self.primary.bind(method, k)
        for pol in self.pairs.values():
            pol.bind(method, k)

    def observe(self, outcome: Outcome, now: float) -> None:
        key = self.engine_pair.get(outcome.engine)
        pol = self.pairs.get(key) if key is not None else None
        (pol or self.primary).observe(outcome, now)
        if outcome.ok:
            self.planner.answered(outcome.completion_tokens)

    # -- peers: the first pair's, as before (one pair); a fleet plans alone ---------------
    def witness(
        self, features: RequestFeatures, route: Route, now: float, loads: tuple[float, float] | None = None
    ) -> Route | None:
        return None if self.fleet else self.primary.witness(features, route, now, loads)

    def follow_leader(
        self, speculating: bool | None, now: float, *, quiet: bool | None = None
    ) -> Route | None:
        return None if self.fleet else self.primary.follow_leader(speculating, now, quiet=quiet)

    def regime(self) -> tuple[bool, bool]:
        return self.primary.regime()

    def snapshot(self) -> dict[str, object]:
        snap = self.primary.snapshot()
        if self.fleet:
            snap["fleet"] = {
                "pairs": {k: {"speculating": p.controller.speculating} for k, p in self.pairs.items()},
                "speculating": sum(p.controller.speculating for p in self.pairs.values()),
                "planned": self.planned,
                "placed": self.placed,
            }
        return snap
