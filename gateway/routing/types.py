"""Value types shared by the OpenAI surface, the proxy and the routing core.

The routing core is pure: it takes a :class:`RequestFeatures` and a :class:`ModelView`
(a snapshot of every engine serving the model, each engine's scraped signals in one
:class:`EngineStats` record) and returns a :class:`Decision`.
After the response it is told the :class:`Outcome`. No I/O crosses this boundary,
so the same core runs inside the gateway and inside the discrete-event simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Protocol, runtime_checkable


class Route(StrEnum):
    """Which engine of a pair serves a request."""

    SPEC = "spec"
    BASE = "base"

    @property
    def other(self) -> Route:
        return Route.BASE if self is Route.SPEC else Route.SPEC


class Reason(StrEnum):
    """Why a request went where it went: the one vocabulary of ``x-specgate-reason``, the
    ``reason`` metric label and span attribute (bounded, so safe as a label)."""

    # hard rules (gateway.routing.rules)
    REFUSED_PARAMS = "refused_params"  # parameters a speculative engine refuses
    FORCED = "forced"  # x-specgate-route from the client, where allowed
    PINNED = "pinned"  # POST /admin/route
    SPEC_DOWN = "spec_down"
    BASE_DOWN = "base_down"
    NO_SPEC = "no_spec"  # the pair has no speculative engine (the plain engine alone)
    # the adaptive policy
    PRIOR = "prior"  # nothing measured yet: the model's prior decided
    PREDICTED_FASTER = "predicted_faster"
    HYSTERESIS = "hysteresis"  # speculating, inside the band (not enough evidence to leave)
    BELOW_BREAK_EVEN = "below_break_even"  # in fallback, inside the band
    HIGH_LOAD = "high_load"  # in fallback: spec would pay unloaded, not at this load
    LOW_ACCEPTANCE = "low_acceptance"  # in fallback: spec would not pay even unloaded
    PROBE = "probe"  # in fallback, measuring whether acceptance recovered
    HANDOVER = "handover"  # a flip waits for the old engine to idle
    IDLE_PAIR = "idle_pair"  # a quiet pair, both engines idle: the engine faster for this request
    JOIN_RUNNING = "join_running"  # a quiet pair, one engine running: joined it (no split)
    EXPLORE = "explore"  # measuring an engine once where its step time was only assumed
    # static policies
    STATIC = "static"
    LOW_TEMPERATURE = "low_temperature"
    HIGH_TEMPERATURE = "high_temperature"
    # the gateway around the policy
    POLICY_ERROR = "policy_error"  # the policy raised: the gateway routed by the hard rules
    FAILOVER = "failover"  # retried on the sibling engine before the first byte
    MOVED = "moved"  # a regime flip moved it to the sibling while it waited for its first byte


# Decisions the hard rules made (the policy priced nothing): not part of the traffic mix.
HARD_RULE_REASONS = frozenset(
    {Reason.REFUSED_PARAMS, Reason.FORCED, Reason.PINNED, Reason.SPEC_DOWN, Reason.BASE_DOWN}
)


class RouteOverride(StrEnum):
    """Values accepted in the ``x-specgate-route`` header and by ``POST /admin/route``."""

    AUTO = "auto"
    SPEC = "spec"
    BASE = "base"


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """What the gateway knows about one request before choosing an engine."""

    model: str
    stream: bool = False
    temperature: float = 1.0  # OpenAI/vLLM default when the field is absent
    top_p: float = 1.0
    n: int = 1
    max_tokens: int | None = None
    prompt_chars: int = 0
    prompt_tokens: int = 0  # estimate (no tokenizer in the gateway)
    # Parameters present in the body that a speculative engine refuses (e.g. "min_p", "logit_bias").
    refused_params: tuple[str, ...] = ()
    # Predicted fraction of the answer that copies the prompt (0..1), and the request class
    # the overlap predictor assigned (a small bounded vocabulary, safe as a metric label).
    overlap: float = 0.0
    kind: str = "unknown"
    # Route forced by the client header, already checked against what config allows.
    forced: Route | None = None
    # A conversation's key for placement across pairs (0: none): the body's ``user``, else a
    # hash of the prompt's opening, which a conversation's later turns repeat.
    affinity: int = 0


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One engine's scraped signals, windowed over its recent ``/metrics`` pages.

    The one record of them: :class:`gateway.engines.parse.MetricsWindow` produces it (in
    the gateway and in the simulator), the routing core reads it in
    :attr:`EngineView.stats`, and ``GET /admin/state`` serialises it with :meth:`as_dict`.
    A new scraped signal is a field here, computed by the parser and read where it is used.
    ``None`` means unknown, never zero.
    """

    at: float = 0.0  # clock time of the newest sample
    window_s: float = 0.0  # span actually covered by the deltas (0 with a single sample)
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    # Windowed speculative statistics (speculative engines only).
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    per_position: tuple[float, ...] | None = None
    # Windowed per-output-token latency in seconds, from vLLM's
    # request_time_per_output_token histogram.
    tpot_s: float | None = None
    # Windowed mean time between a request's successive emissions (one engine step as the
    # requests see it, waits for the other engine included), from vLLM's
    # inter_token_latency histogram. Lets the router fit step times free of acceptance.
    step_s: float | None = None
    # Windowed output tokens per engine step over *all* steps (drafted or not), from the
    # counters: Δgeneration / (Δgeneration − Δaccepted). Speculative engines only.
    tokens_per_step: float | None = None
    drafts: float = 0.0  # Δdrafts in the window (how much evidence the rates rest on)
    generation_tps: float | None = None
    # Prompt tokens prefilled per second over the window (prefix-cache hits excluded), from
    # the counters: the share of the engine's time spent prefilling is this × the per-token
    # prefill cost.
    prefill_tps: float | None = None
    # Preemptions per second over the window: each one prefills its request's whole
    # context again (vLLM's recompute preemption), which the prompt counter does not count.
    preemptions_per_s: float | None = None
    resets: int = 0  # counter resets (engine restarts) seen so far
    # The same signals over the last few seconds only (None: the window is not longer):
    # what an engine that just started running alone shows before a whole window is its own
    recent: EngineStats | None = None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, every field by name."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, EngineStats):
                value = value.as_dict()
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


UNKNOWN_STATS = EngineStats()  # nothing scraped, or too old to use: every signal unknown


@dataclass(frozen=True, slots=True)
class EngineView:
    """Snapshot of one engine as the routing core sees it. ``None`` means unknown, never zero."""

    name: str
    route: Route
    healthy: bool = True
    draining: bool = False
    stale: bool = False  # scraped metrics are too old or missing: ``stats`` is all unknown
    inflight: int = 0  # the gateway's own exact count of requests in flight on this engine
    # when (this clock) the gateway lately stopped relaying requests the engine had not
    # finished (a moved stream, a client gone): the engine counts each until it aborts it,
    # a step or so later
    closed_at: tuple[float, ...] = ()
    method: str | None = None  # speculative method as declared in --speculative-config
    k: int = 0  # num_speculative_tokens
    stats: EngineStats = UNKNOWN_STATS  # the scraped signals (UNKNOWN_STATS when stale)

    @property
    def usable(self) -> bool:
        return self.healthy and not self.draining

    @property
    def load(self) -> float:
        """Requests on the engine: the gateway's exact in-flight count, or the scrape if higher."""
        scraped = (self.stats.running or 0.0) + (self.stats.waiting or 0.0)
        return max(float(self.inflight), scraped)


@dataclass(frozen=True, slots=True)
class PairView:
    """One speculative and one plain engine that share a device timeline (``spec`` None: the
    plain engine alone, where the hard rules route everything to it)."""

    spec: EngineView | None
    base: EngineView
    device: str = ""

    @property
    def engines(self) -> tuple[EngineView, ...]:
        return (self.base,) if self.spec is None else (self.spec, self.base)

    @property
    def speculative(self) -> EngineView:
        """The spec engine of a pair that has one (what a policy sees past the hard rules)."""
        if self.spec is None:
            raise ValueError("this pair has no speculative engine")
        return self.spec


@dataclass(frozen=True, slots=True)
class ModelView:
    model: str
    pairs: tuple[PairView, ...]
    pinned: RouteOverride = RouteOverride.AUTO  # set through POST /admin/route


@dataclass(frozen=True, slots=True)
class Decision:
    """The routing core's answer. ``reason`` is a short token from a bounded vocabulary."""

    route: Route
    engine: str
    reason: Reason
    # Sibling engine to retry on when ``engine`` fails before the first byte; None when the
    # request must not move (e.g. it carries parameters the sibling refuses).
    fallback: str | None = None
    predicted_speedup: float | None = None  # spec time-per-token advantage; >1 favours spec
    predicted_acceptance: float | None = None
    probe: bool = False
    # The policy's model of this request's time per output token on the chosen engine, before
    # any correction by measured latency; None when the request is not a clean measurement
    # of that engine (a probe, or the other engine of the pair was busy). Returned in the
    # Outcome so that the policy learns how far its model is from what it measured.
    predicted_tpot_s: float | None = None
    # This decision flipped the regime: the streams still running on this route's engines
    # should continue on their siblings (the gateway moves those it can; see
    # :mod:`gateway.pipeline.continuation`), so the old engine does not drain beside the new.
    move_from: Route | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a routed request; fed back to the policy after the response."""

    model: str
    route: Route
    engine: str
    kind: str
    temperature: float
    ok: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None
    # Realised prompt-lookup statistics of the answer against the prompt (what an n-gram
    # proposer would have accepted), computed by the gateway after the response.
    lookup_acceptance: float | None = None
    # vLLM's per-request metrics.speculative_decoding object, when the engine reported it.
    reported_acceptance_rate: float | None = None
    reported_mean_acceptance_length: float | None = None
    probe: bool = False
    # Engine emissions (stream deltas) that carried tokens; None when unknown (e.g. non-stream).
    steps: int | None = None
    predicted_tpot_s: float | None = None  # the Decision's, handed back
    extra: dict[str, float] = field(default_factory=dict)


class Policy(Protocol):
    """A routing policy. Implementations are pure and synchronous (called on the event loop)."""

    name: str

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision: ...

    def observe(self, outcome: Outcome, now: float) -> None: ...

    def snapshot(self) -> dict[str, object]:
        """JSON-serialisable state for GET /admin/state and the telemetry collector."""
        ...


@runtime_checkable
class PairBound(Protocol):
    """A policy whose learning depends on the pair's speculative method (an n-gram replay of
    the answers teaches an n-gram pair only): told it when the model's runtime is built,
    before any answer arrives (a pinned request's, a peer's)."""

    def bind(self, method: str | None, k: int) -> None: ...


@runtime_checkable
class Cooperative(Protocol):
    """A policy that can act as one with other gateway replicas over a peer channel
    (:mod:`gateway.peers`): it learns of their requests and follows a leader's regime."""

    def witness(
        self, features: RequestFeatures, route: Route, now: float, loads: tuple[float, float] | None = None
    ) -> Route | None:
        """A peer's request (and the load it found); the route whose streams move now, if any."""
        ...

    def follow_leader(
        self, speculating: bool | None, now: float, *, quiet: bool | None = None
    ) -> Route | None:
        """The leader's regime (None: decide alone); the route whose streams move now, if any."""
        ...

    def regime(self) -> tuple[bool, bool]:
        """(speculating, quiet): what this replica publishes while it leads."""
        ...
