"""The context length the step-time profile is read at: measured from the traffic.

A decode step reads every running sequence's KV cache, so its time grows with the
context the batch holds. A profile read at a fixed context (the configured
``context_tokens``) is off by a factor that is the same for both engines of a pair (the
same model, the same attention), but the gateway only measures that factor on the engine
that runs: its step-time fit (:mod:`.live`) then credits the running regime with an
error that the idle one is still charged: on a pair whose prompts are shorter than the
configured context, the regime that happened to run first would look cheaper than the
other, and stay, whichever was faster.

The context the engines see is known from every answer: a request holds ``P + i`` tokens
at its ``i``-th output token, so over its life it contributes ``L`` steps at a mean of
``P + L/2``; a batch at a random moment holds requests in proportion to their answer
lengths. :class:`ContextTracker` keeps that answer-weighted mean over the recent answers,
and :meth:`ContextTracker.bucket` quantises it (quarter octaves) so that the profile is
re-read only when the traffic's context really moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.routing.adaptive.knobs import knob


@dataclass(frozen=True, slots=True)
class ContextKnobs:
    smoothing: float = knob(0.05, "weight per answer", "the means follow about the last 20 answers")
    min_tokens: int = knob(64, "tokens", "the shortest context a profile is read at")
    max_tokens: int = knob(1 << 20, "tokens", "the longest context a profile is read at")
    steps_per_octave: int = knob(
        4, "buckets per doubling", "the profile is re-read only when the context really moves"
    )


_K = ContextKnobs()


@dataclass
class ContextTracker:
    prior: int  # the configured context, until answers are known
    _tokens: float = 0.0  # mean answer length L (smoothed)
    _held: float = 0.0  # mean of L · (P + L/2) (smoothed)
    answers: int = 0

    def observe(self, prompt_tokens: int, completion_tokens: int) -> None:
        if prompt_tokens < 0 or completion_tokens <= 0:
            return
        n = float(completion_tokens)
        held = n * (prompt_tokens + n / 2.0)
        if self.answers == 0:
            self._tokens, self._held = n, held
        else:
            self._tokens += _K.smoothing * (n - self._tokens)
            self._held += _K.smoothing * (held - self._held)
        self.answers += 1

    def mean(self) -> float:
        """The mean context of the sequences a step decodes (tokens)."""
        if self.answers == 0 or self._tokens <= 0:
            return float(self.prior)
        return self._held / self._tokens

    def bucket(self) -> int:
        """:meth:`mean` rounded to a quarter octave, within [64, 2^20] tokens."""
        ctx = min(float(_K.max_tokens), max(float(_K.min_tokens), self.mean()))
        steps = _K.steps_per_octave
        exponent: float = round(math.log2(ctx) * steps) / steps
        tokens: float = 2.0**exponent
        return round(tokens)
