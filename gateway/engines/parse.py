"""Parse a vLLM ``/metrics`` page into the few numbers the router needs, and window them
into the one :class:`~gateway.routing.types.EngineStats` record the router reads.

Only the families the router reads are handed to ``prometheus_client``'s text parser:
a line filter first drops everything else (a real page is ~50 KB, of which the router
needs ~2 KB), which keeps a parse well under a millisecond on the event loop.

Counters are summed over the ``engine`` label (data-parallel ranks). A family missing
from the page is ``None`` (unknown), never zero: ``--disable-log-stats`` removes all
``vllm:*`` metrics, and a plain engine has no ``spec_decode`` counters at all.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gateway.routing.types import EngineStats

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
GEN_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
CACHED_TOKENS = "vllm:prompt_tokens_cached"
TPOT = "vllm:request_time_per_output_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
PREEMPTIONS = "vllm:num_preemptions"

# Sample names (as they appear at the start of a line) that we keep; everything else is
# dropped before parsing. Prefixes are exact up to the label brace or the space.
_KEEP_SAMPLES = (
    f"{DRAFTS}_total",
    f"{DRAFT_TOKENS}_total",
    f"{ACCEPTED}_total",
    f"{PER_POS}_total",
    RUNNING,
    WAITING,
    KV_USAGE,
    f"{GEN_TOKENS}_total",
    f"{PROMPT_TOKENS}_total",
    f"{CACHED_TOKENS}_total",
    f"{TPOT}_sum",
    f"{TPOT}_count",
    f"{ITL}_sum",
    f"{ITL}_count",
    f"{PREEMPTIONS}_total",
)
_KEEP_FAMILIES = (
    DRAFTS,
    DRAFT_TOKENS,
    ACCEPTED,
    PER_POS,
    RUNNING,
    WAITING,
    KV_USAGE,
    GEN_TOKENS,
    PROMPT_TOKENS,
    CACHED_TOKENS,
    TPOT,
    ITL,
    PREEMPTIONS,
)


class MetricsParseError(ValueError):
    """The page is not Prometheus text exposition format."""


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """Raw values of one scrape. ``None`` = family absent from the page."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_position: tuple[float, ...] | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    cached_tokens: float | None = None  # prompt tokens served from the prefix cache
    tpot_sum: float | None = None
    tpot_count: float | None = None
    itl_sum: float | None = None
    itl_count: float | None = None
    preemptions: float | None = None

    @property
    def has_vllm_metrics(self) -> bool:
        return any(
            v is not None for v in (self.running, self.waiting, self.generation_tokens, self.tpot_count)
        )

    @property
    def has_spec_metrics(self) -> bool:
        return self.drafts is not None and self.draft_tokens is not None and self.accepted is not None


def _wanted(line: str) -> bool:
    if line.startswith("#"):
        # Keep TYPE/HELP lines of wanted families so the parser types them right.
        parts = line.split(" ", 3)
        return len(parts) >= 3 and parts[1] in ("TYPE", "HELP") and parts[2] in _KEEP_FAMILIES
    for name in _KEEP_SAMPLES:
        if line.startswith(name):
            rest = line[len(name) : len(name) + 1]
            if rest in ("{", " "):
                return True
    return False


def filter_page(text: str) -> str:
    """Only the lines of families the router reads (cheap string work, no parsing)."""
    return "\n".join(line for line in text.splitlines() if line.startswith(("vllm:", "# ")) and _wanted(line))


def parse_metrics(text: str, model_name: str | None = None) -> MetricsSample:
    """Parse a ``/metrics`` page. Raises :class:`MetricsParseError` on malformed text.

    ``model_name`` restricts samples to that ``model_name`` label (one server may serve
    several models); ``None`` sums every model.
    """
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    seen: set[str] = set()
    try:
        for fam in text_string_to_metric_families(filter_page(text)):
            for s in fam.samples:
                labels = s.labels
                if model_name is not None and labels.get("model_name", model_name) != model_name:
                    continue
                value = float(s.value)
                if math.isnan(value):
                    continue
                name = s.name
                if name == f"{PER_POS}_total":
                    try:
                        pos = int(labels.get("position", ""))
                    except ValueError:
                        continue
                    if 0 <= pos < 64:
                        per_pos[pos] = per_pos.get(pos, 0.0) + value
                    seen.add(name)
                    continue
                sums[name] = sums.get(name, 0.0) + value
                seen.add(name)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise MetricsParseError(f"malformed metrics page: {exc}") from exc

    def get(name: str) -> float | None:
        return sums.get(name) if name in seen else None

    pp: tuple[float, ...] | None = None
    if per_pos:
        pp = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos) + 1))
    return MetricsSample(
        drafts=get(f"{DRAFTS}_total"),
        draft_tokens=get(f"{DRAFT_TOKENS}_total"),
        accepted=get(f"{ACCEPTED}_total"),
        per_position=pp,
        running=get(RUNNING),
        waiting=get(WAITING),
        kv_usage=get(KV_USAGE),
        generation_tokens=get(f"{GEN_TOKENS}_total"),
        prompt_tokens=get(f"{PROMPT_TOKENS}_total"),
        cached_tokens=get(f"{CACHED_TOKENS}_total"),
        tpot_sum=get(f"{TPOT}_sum"),
        tpot_count=get(f"{TPOT}_count"),
        itl_sum=get(f"{ITL}_sum"),
        itl_count=get(f"{ITL}_count"),
        preemptions=get(f"{PREEMPTIONS}_total"),
    )


def _counters(s: MetricsSample) -> tuple[float | None, ...]:
    return (
        s.drafts,
        s.draft_tokens,
        s.accepted,
        s.generation_tokens,
        s.prompt_tokens,
        s.cached_tokens,
        s.tpot_count,
        s.tpot_sum,
        s.itl_count,
        s.itl_sum,
        s.preemptions,
    )


@dataclass
class MetricsWindow:
    """Keeps the samples of the last ``window_s`` seconds and turns counters into rates.

    A counter that went down means the engine restarted: the history is dropped and the
    window starts again from the new sample.
    """

    window_s: float = 10.0
    min_drafts: float = 1.0  # fewer drafts than this in the window → acceptance unknown
    min_tokens: float = 200.0  # fewer generated tokens than this → tokens per step unknown
    # ``EngineStats.recent``: the last this many seconds (none while the window is shorter)
    recent_s: float = 3.0
    _hist: deque[tuple[float, MetricsSample]] = field(default_factory=deque)
    resets: int = 0

    def add(self, now: float, sample: MetricsSample) -> EngineStats:
        if self._hist and self._is_reset(self._hist[-1][1], sample):
            self._hist.clear()
            self.resets += 1
        self._hist.append((now, sample))
        # Keep one sample at or before the window start so the deltas cover the full window.
        while len(self._hist) > 2 and self._hist[1][0] <= now - self.window_s:
            self._hist.popleft()
        return self.stats()

    @staticmethod
    def _is_reset(old: MetricsSample, new: MetricsSample) -> bool:
        for a, b in zip(_counters(old), _counters(new), strict=True):
            if a is not None and b is not None and b < a:
                return True
        if old.per_position and new.per_position:
            for a, b in zip(old.per_position, new.per_position, strict=False):
                if b < a:
                    return True
        return False

    def reset(self) -> None:
        self._hist.clear()

    def stats(self) -> EngineStats:
        if not self._hist:
            return EngineStats(at=0.0, window_s=0.0, resets=self.resets)
        t1, new = self._hist[-1]
        t0, old = self._hist[0]
        recent = None
        if t1 - t0 > self.recent_s and self.recent_s > 0:
            # the newest sample at or before the recent window's start
            r0, r_old = next((t, s) for t, s in reversed(self._hist) if t <= t1 - self.recent_s)
            if r0 > t0:
                recent = self._between(r0, r_old, t1, new, None)
        return self._between(t0, old, t1, new, recent)

    def _between(
        self, t0: float, old: MetricsSample, t1: float, new: MetricsSample, recent: EngineStats | None
    ) -> EngineStats:
        span = t1 - t0

        def delta(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None or span <= 0 else b - a

        d_drafts = delta(old.drafts, new.drafts)
        d_tokens = delta(old.draft_tokens, new.draft_tokens)
        d_acc = delta(old.accepted, new.accepted)
        rate = al = None
        pp: tuple[float, ...] | None = None
        if d_drafts is not None and d_drafts >= self.min_drafts and d_acc is not None:
            al = 1.0 + d_acc / d_drafts
            if d_tokens:
                rate = d_acc / d_tokens
            if old.per_position is not None and new.per_position is not None:
                n = len(new.per_position)
                olds = old.per_position + (0.0,) * (n - len(old.per_position))
                pp = tuple(
                    min(1.0, max(0.0, (b - a) / d_drafts))
                    for a, b in zip(olds, new.per_position, strict=False)
                )
        d_cnt = delta(old.tpot_count, new.tpot_count)
        d_sum = delta(old.tpot_sum, new.tpot_sum)
        tpot = d_sum / d_cnt if d_cnt and d_sum is not None and d_cnt > 0 else None
        d_gen = delta(old.generation_tokens, new.generation_tokens)
        gen_tps = d_gen / span if d_gen is not None else None
        d_prompt = delta(old.prompt_tokens, new.prompt_tokens)
        prefill_tps = None
        if d_prompt is not None:
            d_cached = delta(old.cached_tokens, new.cached_tokens) or 0.0
            prefill_tps = max(0.0, d_prompt - d_cached) / span
        d_pre = delta(old.preemptions, new.preemptions)
        d_icnt = delta(old.itl_count, new.itl_count)
        d_isum = delta(old.itl_sum, new.itl_sum)
        step = d_isum / d_icnt if d_icnt and d_isum is not None and d_icnt > 0 else None
        tps = None
        if d_gen is not None and d_acc is not None and d_gen > d_acc >= 0 and d_gen >= self.min_tokens:
            tps = d_gen / (d_gen - d_acc)
        return EngineStats(
            at=t1,
            window_s=span,
            running=new.running,
            waiting=new.waiting,
            kv_usage=new.kv_usage,
            acceptance_rate=rate,
            mean_acceptance_length=al,
            per_position=pp,
            tpot_s=tpot,
            step_s=step,
            tokens_per_step=tps,
            drafts=d_drafts or 0.0,
            generation_tps=gen_tps,
            prefill_tps=prefill_tps,
            preemptions_per_s=None if d_pre is None else max(0.0, d_pre) / span,
            resets=self.resets,
            recent=recent,
        )
