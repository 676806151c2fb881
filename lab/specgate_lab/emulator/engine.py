"""The engine model: continuous batching with speculative steps, free of sockets and clocks.

One :class:`Engine` is one vLLM engine (one served model). It holds requests in a
waiting queue and a running batch of at most ``max_num_seqs``; every *step* it
admits waiting requests (prefill, chunked under ``max_num_batched_tokens``), lets
each decoding request draft (speculative engines), and prices the step with a
:class:`gateway.physics.StepTimeProfile` (:mod:`specgate_lab.emulator.stepcost`). Time is
always passed in (seconds, any origin), so the same code runs in real time
(:mod:`specgate_lab.emulator.device` driver) and in virtual time (``lab/specgate_lab/sim``).

Driving it by hand (what :class:`specgate_lab.emulator.device.Device` does)::

    eng = Engine(EngineConfig(served_model_name="m", spec=parse_spec_config(...)))
    req = eng.make_request("prompt text", max_tokens=128, temperature=0.0)
    eng.add_request(req, now)
    plan = eng.plan_step(now)            # StepPlan: batch, q, ctx, duration_s (or None: idle)
    events = eng.commit_step(now + plan.duration_s)   # TokenEvents, one per request touched

``plan_step`` must be followed by ``commit_step`` before the next ``plan_step``.
Engines that share a GPU run their steps on one :class:`~specgate_lab.emulator.device.Device`
timeline, which decides when each step really ends.

Per-request acceptance: for ``ngram``/``suffix`` a real
:class:`gateway.text.PromptLookupProposer` drafts from prompt + generated tokens and a
draft token is accepted while it equals the next answer token, at any temperature (the
answer text carries what sampling chose). For
model-based methods the accepted length is sampled from per-position curves.
Counters live in :attr:`Engine.stats` (plain ints, for the simulator) and are
forwarded to an optional :class:`EngineObserver` (Prometheus, see ``metrics.py``;
an observer may also define ``on_preempt(req)``).

KV cache: ``num_gpu_blocks`` x ``block_size`` tokens. Requests are admitted while their
prompt fits; when the running batch would overflow, the newest requests are preempted
and later recompute (prefill prompt + output again), as vLLM does.

The data types (:class:`EngineConfig`, :class:`EngineRequest`, :class:`StepPlan`,
:class:`TokenEvent`, :class:`EngineStats`, :class:`EngineObserver`) live in
:mod:`specgate_lab.emulator.engine_types` and the drafting/verification helpers
(:func:`indexed_proposer`, ...) in :mod:`specgate_lab.emulator.drafting`; both are
re-exported here.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from typing import cast

from gateway.physics import StepTimeProfile, get_profile
from gateway.text.lookup import Proposer
from gateway.text.suffix import AnswerCache, SuffixProposer
from specgate_lab.emulator.acceptance import curve_for, sample_accepted, synthetic_curve
from specgate_lab.emulator.drafting import apply_stop, indexed_proposer, verify_text_drafts
from specgate_lab.emulator.engine_types import (
    FINISH_REASONS,
    EngineConfig,
    EngineObserver,
    EngineRequest,
    EngineStats,
    StepEntry,
    StepPlan,
    TokenEvent,
)
from specgate_lab.emulator.stepcost import price_step
from specgate_lab.emulator.template import model_tokenize
from specgate_lab.emulator.textgen import PromptKind, answer_seed
from specgate_lab.emulator.thinking import AnswerMemory, answer_for

__all__ = [
    "FINISH_REASONS",
    "Engine",
    "EngineConfig",
    "EngineObserver",
    "EngineRequest",
    "EngineStats",
    "StepEntry",
    "StepPlan",
    "TokenEvent",
    "indexed_proposer",
]


class Engine:
    """One emulated vLLM engine (see the module docstring for the protocol)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        profile: StepTimeProfile | None = None,
        observer: EngineObserver | None = None,
    ) -> None:
        self.config = config
        self.spec = config.spec
        self.profile = profile or get_profile(config.profile)
        self.observer = observer
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.stats = EngineStats(accepted_per_pos=[0] * (config.spec.k if config.spec else 0))
        self._plan: StepPlan | None = None
        self._ids = itertools.count()
        self._kv_capacity = config.num_gpu_blocks * config.block_size
        self.step_overhead_ms = 0.0  # extra host time per step (fault knob / tuning)
        self._released: set[int] = set()  # released while a step was planned (see release)
        #: prompts answered before, whose continuations go on with their answers (a server's
        #: engines share :data:`specgate_lab.emulator.thinking.ANSWERS`; the simulator's have none)
        self.memory: AnswerMemory | None = None
        # suffix decoding's global tree: the answers this engine finished (bounded)
        sx = self.spec.suffix if self.spec is not None else None
        self.answers = AnswerCache(sx.max_cached_requests) if sx is not None else None

    # --- requests -----------------------------------------------------------------
    def make_request(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        ignore_eos: bool = False,
        stop: tuple[str, ...] = (),
        request_id: str | None = None,
        kind: PromptKind | None = None,
        prompt_tokens: list[str] | None = None,
        n_param: int = 1,
    ) -> EngineRequest:
        """The answer starts where the prompt's text says
        (:func:`~specgate_lab.emulator.thinking.answer_for`)."""
        counter = next(self._ids)
        toks = prompt_tokens if prompt_tokens is not None else model_tokenize(prompt)
        s = answer_seed(seed, self.config.seed, counter, temperature)
        thinking = self.config.reasoning_parser is not None
        gen = answer_for(prompt, toks, s, temperature, kind, thinking=thinking, memory=self.memory)
        req = EngineRequest(
            request_id=request_id or f"req-{counter}",
            prompt=prompt,
            prompt_tokens=toks,
            max_tokens=max(1, max_tokens),
            temperature=max(0.0, temperature),
            gen=gen,
            ignore_eos=ignore_eos,
            stop=stop,
            n_param=n_param,
            rng=random.Random(hash((s, counter, self.config.seed, 0x5EED))),
        )
        self._speculate(req)
        return req

    def add_request(self, req: EngineRequest, now: float) -> None:
        req.arrival = now
        self.waiting.append(req)

    def _take_off(self, req: EngineRequest) -> bool:
        """Remove an unfinished request from the running or waiting list; False if it is
        not here or already done."""
        if req.finish_reason is not None:
            return False
        if req in self.running:
            self.running.remove(req)
            return True
        try:
            self.waiting.remove(req)
        except ValueError:
            return False
        return True

    def _speculate(self, req: EngineRequest) -> None:
        """Set up ``req``'s acceptance on this engine's drafter (none for a plain engine):
        per-position counters, and the acceptance curve of a drafter that is not text-based
        (a text-based one gets its proposer when the prompt is prefilled)."""
        spec = self.spec
        if spec is None:
            return
        if not req.accepted_per_pos:
            req.accepted_per_pos = [0] * spec.k
        if spec.synthetic:
            req.cond = synthetic_curve(spec.synthetic_rates, spec.synthetic_length, spec.k)
        elif not spec.text_based:
            req.cond = curve_for(spec.method, req.gen.kind, req.temperature, spec.k)

    def release(self, req: EngineRequest) -> bool:
        """Take an unfinished request off this engine without finishing it: the gateway
        continues it on the sibling (:meth:`adopt`). To vLLM this is the client going away,
        so it counts as an abort. False if it is not here or already done."""
        if not self._take_off(req):
            return False
        self.stats.finished["abort"] += 1
        if self._plan is not None:
            self._released.add(id(req))
        return True

    def adopt(self, req: EngineRequest, now: float) -> None:
        """Continue a request released by the sibling engine: to vLLM a new request whose
        prompt is the old prompt plus the text generated so far, all of it prefilled here
        before the next token; the answer goes on where it stopped."""
        req.recompute = len(req.output)
        req.prefilled = 0
        req.continued = True
        self._speculate(req)
        spec = self.spec
        if spec is None:
            req.proposer = None
        elif spec.text_based and req.proposer is None:
            req.proposer = self._proposer(req)
            req.proposer.extend(req.output)
        self.waiting.append(req)

    def abort(self, req: EngineRequest, now: float) -> bool:
        """Abort a request (client went away): frees its slot at once. False if already done."""
        if not self._take_off(req):
            return False
        req.finish_reason = "abort"
        req.finished_at = now
        self.stats.finished["abort"] += 1
        if self.observer:
            self.observer.on_finished(req)
        return True

    # --- state ----------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_tokens(self) -> int:
        bs = self.config.block_size
        return sum(-(-r.ctx // bs) * bs for r in self.running)

    def kv_usage(self) -> float:
        return min(1.0, self.kv_tokens() / self._kv_capacity) if self._kv_capacity else 0.0

    def _kv_committed(self) -> int:
        """KV tokens (whole blocks) the running batch needs through its next step."""
        per_step = 1 + (self.spec.k if self.spec else 0)
        bs = self.config.block_size
        return sum(-(-(r.ctx + per_step) // bs) * bs for r in self.running)

    def _preempt_if_full(self) -> bool:
        """vLLM's recompute preemption: when the running batch's KV cache (plus this
        step's tokens) would overflow, the newest requests go back to the waiting queue
        and later prefill their prompt and output again."""
        per_step = 1 + (self.spec.k if self.spec else 0)
        bs = self.config.block_size
        cap = self._kv_capacity
        used = sum(-(-(r.ctx + per_step) // bs) * bs for r in self.running)
        preempted = False
        while used > cap and len(self.running) > 1:
            preempted = True
            victim = self.running.pop()
            used -= -(-(victim.ctx + per_step) // bs) * bs
            victim.recompute = len(victim.output)
            victim.prefilled = 0
            self.waiting.appendleft(victim)
            self.stats.preemptions += 1
            on_preempt = getattr(self.observer, "on_preempt", None)
            if on_preempt is not None:
                on_preempt(victim)
        return preempted

    # --- stepping ---------------------------------------------------------------------
    def plan_step(self, now: float) -> StepPlan | None:
        """Schedule the next step; None when there is nothing to do."""
        if self._plan is not None:
            raise RuntimeError("plan_step() called twice without commit_step()")
        cfg = self.config
        preempted = self._preempt_if_full()
        budget = cfg.max_num_batched_tokens
        entries: list[StepEntry] = []
        spec = self.spec
        n_dec = 0
        dec_tokens = 0
        ctx_sum = 0
        drafted_k = 0
        k_now = spec.k_at(len(self.running)) if spec is not None else 0  # Dynamic SD: K by batch
        # 1. decoding requests (and those still mid-prefill) first
        for req in self.running:
            if req.prefilled < req.prefill_target:
                chunk = min(budget, req.prefill_target - req.prefilled)
                if chunk > 0:
                    entries.append(StepEntry(req, prefill=chunk))
                    budget -= chunk
                continue
            e = StepEntry(req)
            if spec is not None:
                room = min(req.max_tokens - len(req.output), cfg.max_model_len - req.ctx, k_now + 1) - 1
                if room > 0:
                    if spec.text_based:
                        assert req.proposer is not None
                        d = cast(list[str], req.proposer.propose()[:room])
                        e.drafts = d
                        e.n_drafts = len(d)
                    else:
                        e.n_drafts = room
            entries.append(e)
            n_dec += 1
            dec_tokens += 1 + e.n_drafts
            drafted_k = max(drafted_k, e.n_drafts)
            ctx_sum += req.ctx
            budget -= 1 + e.n_drafts
        # 2. admit waiting requests while there is room (slots, token budget, KV)
        kv_free = self._kv_capacity - self._kv_committed()
        per_step = 1 + (spec.k if spec else 0)
        while self.waiting and not preempted and len(self.running) < cfg.max_num_seqs and budget > 0:
            req = self.waiting[0]
            need = req.prefill_target + per_step
            if need > kv_free and self.running:
                break
            self.waiting.popleft()
            self.running.append(req)
            if req.scheduled_at is None:
                req.scheduled_at = now
            kv_free -= need
            chunk = min(budget, req.prefill_target)
            entries.append(StepEntry(req, prefill=chunk))
            budget -= chunk
        if not entries:
            return None
        plan = price_step(
            entries,
            profile=self.profile,
            spec=spec,
            k_now=k_now,
            n_dec=n_dec,
            dec_tokens=dec_tokens,
            ctx_sum=ctx_sum,
            drafted_k=drafted_k,
            overhead_ms=self.step_overhead_ms,
            spec_cost_scale=cfg.spec_cost_scale,
            device_scale=cfg.device_scale,
            spec_cost_slope=cfg.spec_cost_slope,
            device_scale_slope=cfg.device_scale_slope,
        )
        self._plan = plan
        return plan

    def commit_step(self, now: float) -> list[TokenEvent]:
        """Finish the planned step at ``now``: emit tokens, verify drafts, retire requests."""
        plan = self._plan
        if plan is None:
            raise RuntimeError("commit_step() without plan_step()")
        self._plan = None
        released, self._released = self._released, set()
        st = self.stats
        obs = self.observer
        st.steps += 1
        st.busy_s += plan.duration_s
        if obs:
            obs.on_step(plan, now)
        events: list[TokenEvent] = []
        spec = self.spec
        step_drafts = step_draft_toks = step_acc = 0
        step_pos = [0] * (spec.k if spec else 0)
        for e in plan.entries:
            req = e.req
            if req.finish_reason is not None or id(req) in released:
                continue  # aborted or released mid-step
            if e.prefill:
                first_pass = req.recompute == 0
                req.prefilled += e.prefill
                if first_pass or req.continued:  # a continuation is a new request to vLLM
                    st.prompt_tokens += e.prefill
                    if obs:
                        obs.on_prompt_tokens(e.prefill)
                if req.prefilled < req.prefill_target:
                    continue
                if not first_pass:
                    req.continued = False
                    events.append(self._emit(req, 1, now))  # resumed (preempted or moved)
                    continue
                # prefill complete: the step samples the first token
                if spec is not None and spec.text_based:
                    req.proposer = self._proposer(req)
                ev = self._emit(req, 1, now)
                req.first_token_at = now
                if obs:
                    obs.on_first_token(req)
                events.append(ev)
                continue
            accepted = 0
            if e.n_drafts:
                if spec is not None and spec.text_based and not spec.synthetic:
                    accepted = verify_text_drafts(req, e.drafts or [])
                else:
                    accepted = sample_accepted(req.cond, e.n_drafts, req.rng)
                req.num_drafts += 1
                req.num_draft_tokens += e.n_drafts
                req.num_accepted += accepted
                step_drafts += 1
                step_draft_toks += e.n_drafts
                step_acc += accepted
                for i in range(accepted):
                    req.accepted_per_pos[i] += 1
                    step_pos[i] += 1
            events.append(self._emit(req, accepted + 1, now))
        if step_drafts:
            st.num_drafts += step_drafts
            st.num_draft_tokens += step_draft_toks
            st.num_accepted += step_acc
            for i, v in enumerate(step_pos):
                st.accepted_per_pos[i] += v
            if obs:
                obs.on_spec(step_drafts, step_draft_toks, step_acc, step_pos)
        if any(ev.finish_reason for ev in events):
            self.running = [r for r in self.running if r.finish_reason is None]
        return events

    def _proposer(self, req: EngineRequest) -> Proposer:
        """A text proposer over the request's prompt: suffix decoding's (drafting from the
        engine's earlier answers too) for ``suffix``, else vLLM's prompt lookup."""
        spec = self.spec
        assert spec is not None
        if spec.suffix is not None:
            return SuffixProposer(req.prompt_tokens, spec.suffix, self.answers)
        return indexed_proposer(
            req.prompt_tokens, k=spec.k, n_min=spec.prompt_lookup_min, n_max=spec.prompt_lookup_max
        )

    def _emit(self, req: EngineRequest, n: int, now: float) -> TokenEvent:
        """Append up to ``n`` answer tokens to ``req`` and decide whether it finished."""
        cfg = self.config
        start = len(req.output)
        natural = max(1, req.gen.natural_length) if not req.ignore_eos else 1 << 60
        limit = max(start + 1, min(req.max_tokens, cfg.max_model_len - req.num_prompt_tokens))
        end = max(start + 1, min(start + n, natural, limit))
        finish: str | None = None
        if end >= natural:
            finish = "stop"
        elif end >= limit:
            finish = "length"
        toks = req.gen.tokens(start, end)
        if req.stop:
            toks, hit = apply_stop(req, toks)
            if hit:
                finish = "stop"
        req.output.extend(toks)
        if req.proposer is not None:
            req.proposer.extend(toks)
        itl = (now - req.last_token_at) if req.last_token_at is not None else None
        req.last_token_at = now
        self.stats.generation_tokens += len(toks)
        if self.observer:
            self.observer.on_tokens(req, len(toks), itl)
        if finish is not None:
            req.finish_reason = finish
            req.finished_at = now
            self.stats.finished[finish] += 1
            if self.answers is not None:
                self.answers.add(req.output)
            if self.observer:
                self.observer.on_finished(req)
        return TokenEvent(req, toks, now, finish)
