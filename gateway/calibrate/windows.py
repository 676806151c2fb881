"""Windows of steps read off vLLM's ``/metrics``: what a step-time fit is made of.

Between two scrapes of one engine (vLLM's own names, as in a real 0.20.2 page):

- steps: ``vllm:iteration_tokens_total_count`` (one observation per engine step);
- decoding sequences per step: ``vllm:inter_token_latency_seconds_count`` (one
  observation per decoding sequence per step) over the steps;
- the mean step: ``vllm:inter_token_latency_seconds_sum`` over its count (each decoding
  sequence waits one step between its emissions);
- tokens verified per step: the decoding sequences plus
  ``vllm:spec_decode_num_draft_tokens_total`` over the steps (real vLLM's iteration
  histogram counts *accepted* tokens, not verified ones, so its sum is not used);
- prompt tokens prefilled per step: ``vllm:prompt_tokens_total`` less
  ``vllm:prompt_tokens_cached_total``, over the steps;
- the context: mean prompt (``vllm:request_prompt_tokens``) plus half the mean answer
  (``vllm:request_generation_tokens``) of the requests finished so far.

Both engines of a pair share one GPU: a window is kept only when the *other* engine took
no step at all in it (its step counter did not move), so the step time is the engine's
own and not the device's time-slicing of two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gateway.physics.fit import Window

STEPS = "vllm:iteration_tokens_total_count"
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
CACHED = "vllm:prompt_tokens_cached_total"
REQ_PROMPT_SUM = "vllm:request_prompt_tokens_sum"
REQ_PROMPT_COUNT = "vllm:request_prompt_tokens_count"
REQ_GEN_SUM = "vllm:request_generation_tokens_sum"
REQ_GEN_COUNT = "vllm:request_generation_tokens_count"
RUNNING = "vllm:num_requests_running"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SAMPLES = (
    STEPS,
    ITL_SUM,
    ITL_COUNT,
    DRAFT_TOKENS,
    PROMPT,
    CACHED,
    REQ_PROMPT_SUM,
    REQ_PROMPT_COUNT,
    REQ_GEN_SUM,
    REQ_GEN_COUNT,
    RUNNING,
)


@dataclass(frozen=True, slots=True)
class Scrape:
    """The samples of one ``/metrics`` page that a fit reads, at ``t`` seconds."""

    t: float
    values: dict[str, float]
    spec_k: int = 0  # draft positions on the page (0: a plain engine)

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)


def parse_scrape(text: str, t: float, model_name: str | None = None) -> Scrape:
    """The fit's samples of a ``/metrics`` page (summed over ``engine`` ranks; only
    ``model_name``'s when given). Raises ValueError on a page that is not Prometheus text."""
    wanted = (*SAMPLES, PER_POS)
    lines = [ln for ln in text.splitlines() if ln.startswith(wanted)]  # samples only: read untyped
    values: dict[str, float] = {}
    positions: set[str] = set()
    for fam in text_string_to_metric_families("\n".join(lines) + "\n"):
        for s in fam.samples:
            if model_name is not None and s.labels.get("model_name", model_name) != model_name:
                continue
            if s.name == PER_POS:
                positions.add(s.labels.get("position", ""))
            elif s.name in SAMPLES and not math.isnan(s.value):
                values[s.name] = values.get(s.name, 0.0) + float(s.value)
    return Scrape(t, values, len(positions))


def _ctx(old: Scrape, new: Scrape) -> float:
    """Mean prompt plus half the mean answer of the requests finished in the window (or so far)."""
    for a, b in ((old, new), (None, new)):
        n_p = b.get(REQ_PROMPT_COUNT) - (a.get(REQ_PROMPT_COUNT) if a else 0.0)
        n_g = b.get(REQ_GEN_COUNT) - (a.get(REQ_GEN_COUNT) if a else 0.0)
        if n_p > 0 and n_g > 0:
            p = (b.get(REQ_PROMPT_SUM) - (a.get(REQ_PROMPT_SUM) if a else 0.0)) / n_p
            g = (b.get(REQ_GEN_SUM) - (a.get(REQ_GEN_SUM) if a else 0.0)) / n_g
            return max(1.0, p + g / 2)
    return 1024.0


def window_between(old: Scrape, new: Scrape, *, spec: bool, min_steps: int = 20) -> Window | None:
    """The steps of one engine between two of its scrapes (None: too few to say)."""
    steps = new.get(STEPS) - old.get(STEPS)
    emissions = new.get(ITL_COUNT) - old.get(ITL_COUNT)
    if steps < min_steps or emissions <= 0:
        return None
    step_ms = 1e3 * (new.get(ITL_SUM) - old.get(ITL_SUM)) / emissions
    batch = emissions / steps
    drafts = max(0.0, new.get(DRAFT_TOKENS) - old.get(DRAFT_TOKENS))
    prompt = max(0.0, (new.get(PROMPT) - old.get(PROMPT)) - (new.get(CACHED) - old.get(CACHED)))
    return Window(
        spec=spec,
        step_ms=step_ms,
        batch=batch,
        verify_tokens=batch + drafts / steps,
        prefill_tokens=prompt / steps,
        ctx=_ctx(old, new),
        weight=1.0,
    )


def pair_windows(
    spec: Sequence[Scrape],
    base: Sequence[Scrape],
    *,
    window_s: float = 4.0,
    min_steps: int = 20,
    max_load_spread: float = 1.5,
) -> list[Window]:
    """Windows of each engine while the other took no step, from scrapes of both taken
    together (``spec[i]`` and ``base[i]`` at about the same time), non-overlapping,
    each at least ``window_s`` long (a rejected start slides on by one scrape). A window
    whose running-request gauge moved more than ``max_load_spread`` x (a change of load
    inside it; readings of 0, or a dip from 2 to 1, aside) is left out."""
    out: list[Window] = []
    n = min(len(spec), len(base))
    for mine, other, is_spec in ((spec, base, True), (base, spec, False)):
        i = 0
        while i < n - 1:
            j = i + 1
            while j < n and mine[j].t - mine[i].t < window_s:
                j += 1
            if j >= n:
                break
            run = [mine[x].get(RUNNING) for x in range(i, j + 1)]
            quiet = other[j].get(STEPS) == other[i].get(STEPS)
            # the load held: the gauge's readings within max_load_spread x of each other
            # (not a ramp or a drain), though one read between two requests of a slot may
            # dip by one, or to 0 (at most half of them)
            busy = [r for r in run if r > 0]
            steady = 2 * len(busy) > len(run) and max(busy) <= max_load_spread * max(2.0, min(busy))
            w = window_between(mine[i], mine[j], spec=is_spec, min_steps=min_steps)
            if w is not None and quiet and steady:
                out.append(w)
                i = j  # the next window starts where this one ended
            else:
                i += 1  # slide on until the load holds still
    return out
