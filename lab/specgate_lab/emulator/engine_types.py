"""The engine model's data: configuration, requests, step plans, counters, observer.

These are the types :class:`specgate_lab.emulator.engine.Engine` works on (re-exported
there): :class:`EngineConfig` configures an engine, :class:`EngineRequest` is one
sequence with its state and speculative counters, :class:`StepPlan` (made of
:class:`StepEntry`) is what ``plan_step`` scheduled, :class:`TokenEvent` is what
``commit_step`` emitted, :class:`EngineStats` holds the cumulative counters and
:class:`EngineObserver` receives them as they happen.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.text.lookup import Proposer
from specgate_lab.emulator.spec import SpecConfig
from specgate_lab.emulator.textgen import PromptKind
from specgate_lab.emulator.thinking import AnswerStream

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
SPEC_COST_SCALE_MAX = 10.0  # the largest spec_cost_scale an engine takes
SLOPE_MAX = 1.0  # the steepest spec_cost_slope / device_scale_slope an engine takes


def check_spec_cost_scale(value: float, name: str = "spec_cost_scale") -> None:
    """Refuse a spec_cost_scale outside 0..SPEC_COST_SCALE_MAX (NaN included), naming it
    as the caller knows it (a YAML key, a command-line option)."""
    if not 0.0 <= value <= SPEC_COST_SCALE_MAX:
        raise ValueError(f"{name} must be within 0..{SPEC_COST_SCALE_MAX:g}, got {value}")


REASONING_PARSERS = ("qwen3",)
REASONING_FIELDS = ("reasoning", "reasoning_content")
REASONING_PARSER_MODES = ("prompt-aware", "generated-only")


def check_reasoning(parser: str | None, field_name: str, mode: str) -> None:
    """Refuse a reasoning parser, field or parser mode the emulator does not know."""
    for name, v, allowed in (
        ("reasoning_parser", parser, (None, *REASONING_PARSERS)),
        ("reasoning_field", field_name, REASONING_FIELDS),
        ("reasoning_parser_mode", mode, REASONING_PARSER_MODES),
    ):
        if v not in allowed:
            raise ValueError(f"{name} must be one of {[a for a in allowed if a]}, got {v!r}")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    served_model_name: str = "qwen3-8b"
    model: str = "Qwen/Qwen3-8B"
    spec: SpecConfig | None = None
    max_num_seqs: int = 256
    max_model_len: int = 4096
    max_num_batched_tokens: int = 8192
    profile: str = "h200-qwen3-8b"
    seed: int = 0
    #: KV blocks of 16 tokens (the real H200 fixture engine had 4185 at 0.42 memory).
    num_gpu_blocks: int = 4185
    block_size: int = 16
    #: What speculation adds to a step (verification beyond one token, drafting) as a
    #: multiple of the profile's price: 1 = the profile (see ``stepcost.price_step``).
    spec_cost_scale: float = 1.0
    #: The device's step times as a multiple of the profile's, for both kinds of engine
    #: alike: another GPU than the profile was measured on (an H100 against the H200 profile).
    device_scale: float = 1.0
    #: How those two change with the batch: each is multiplied by (batch ÷ 8) ** slope,
    #: so 0 keeps it flat. A real H100 against the H200 profile read plain 1.0 x at 10 in
    #: flight and 1.3-1.5 x at 64 (a device slope near 0.18), and EAGLE-3's step 1.4 x at 10
    #: but 1.24 x at 64 (what speculation adds grows cheaper with the batch: a negative
    #: spec slope); see results/gpu/round16.
    spec_cost_slope: float = 0.0
    device_scale_slope: float = 0.0
    #: vLLM's ``--reasoning-parser`` (``qwen3``; None: off, as vLLM's default): the model
    #: thinks (``<think>`` reasoning ``</think>`` before its content) and the chat answer
    #: carries the reasoning apart, in ``reasoning_field``. ``reasoning_parser_mode``:
    #: ``prompt-aware`` (newer vLLM: a prompt whose think block has ended makes everything
    #: generated content) or ``generated-only`` (older: whatever the engine generates
    #: before a ``</think>`` of its own is reasoning).
    reasoning_parser: str | None = None
    reasoning_field: str = "reasoning"
    reasoning_parser_mode: str = "prompt-aware"

    def __post_init__(self) -> None:
        check_reasoning(self.reasoning_parser, self.reasoning_field, self.reasoning_parser_mode)
        check_spec_cost_scale(self.spec_cost_scale)
        check_spec_cost_scale(self.device_scale, "device_scale")
        for name in ("spec_cost_slope", "device_scale_slope"):
            v = getattr(self, name)
            if not -SLOPE_MAX <= v <= SLOPE_MAX:  # NaN fails too
                raise ValueError(f"{name} must be within ±{SLOPE_MAX}, got {v!r}")


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """Tokens a request produced in one step (several when drafts were accepted)."""

    request: EngineRequest
    tokens: list[str]
    time: float
    finish_reason: str | None = None


@dataclass(eq=False)
class EngineRequest:
    request_id: str
    prompt: str
    prompt_tokens: list[str]
    max_tokens: int
    temperature: float
    gen: AnswerStream
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    n_param: int = 1
    #: Called with each TokenEvent by the real-time driver (not by the engine itself).
    listener: Callable[[TokenEvent], None] | None = None
    # --- state ---
    arrival: float = 0.0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    prefilled: int = 0
    recompute: int = 0  # output tokens to prefill again after a preemption
    continued: bool = False  # moved from the sibling engine: its prefill is a new prompt here
    output: list[str] = field(default_factory=list)
    text_len: int = 0
    proposer: Proposer | None = None
    rng: random.Random = field(default_factory=random.Random)
    cond: list[float] = field(default_factory=list)
    # --- speculative counters of this request ---
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @property
    def kind(self) -> PromptKind:
        return self.gen.kind

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_tokens)

    @property
    def ctx(self) -> int:
        return self.prefilled + len(self.output) - self.recompute

    @property
    def prefill_target(self) -> int:
        """Tokens to prefill: the prompt, plus the output so far after a preemption."""
        return len(self.prompt_tokens) + self.recompute

    def spec_summary(self) -> dict[str, object]:
        """vLLM's per-request ``metrics.speculative_decoding`` object."""
        d = self.num_drafts
        return {
            "num_drafts": d,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_draft_tokens": self.num_accepted,
            "num_accepted_tokens_per_pos": list(self.accepted_per_pos),
            "mean_acceptance_length": (1.0 + self.num_accepted / d) if d else 1.0,
            "draft_acceptance_rate": (self.num_accepted / self.num_draft_tokens)
            if self.num_draft_tokens
            else 0.0,
        }


@dataclass(slots=True)
class StepEntry:
    """One request's share of a planned step: a prefill chunk, or one decode (+ drafts)."""

    req: EngineRequest
    prefill: int = 0  # prompt tokens prefilled in this step
    drafts: list[str] | None = None  # n-gram draft tokens
    n_drafts: int = 0


@dataclass(frozen=True, slots=True)
class StepPlan:
    batch: int  # sequences in the step (decoding + prefilling)
    q: float  # mean tokens verified per decoding sequence (1 + drafts)
    ctx: float  # mean context of the decoding sequences
    prefill_tokens: int
    num_tokens: int  # tokens scheduled in the step (vLLM's iteration_tokens)
    draft_ms: float
    duration_s: float
    entries: tuple[StepEntry, ...] = ()


@dataclass(slots=True)
class EngineStats:
    """Cumulative counters (the ``vllm:*`` counters without Prometheus)."""

    steps: int = 0
    busy_s: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    preemptions: int = 0


class EngineObserver(Protocol):
    def on_step(self, plan: StepPlan, now: float) -> None: ...

    def on_first_token(self, req: EngineRequest) -> None: ...

    def on_tokens(self, req: EngineRequest, n: int, itl_s: float | None) -> None: ...

    def on_spec(self, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> None: ...

    def on_finished(self, req: EngineRequest) -> None: ...

    def on_prompt_tokens(self, n: int) -> None: ...
