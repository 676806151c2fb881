"""What the gateway would see of an emulated engine: a scraper-like, windowed view.

Every simulated second :class:`SimMonitor` takes the engine's cumulative counters (the
numbers its ``/metrics`` page would show), feeds them to the same
:class:`~gateway.engines.parse.MetricsWindow` the real scraper uses, and keeps the
:class:`~gateway.routing.types.EngineStats` record. :meth:`view` hands it to the policy
with a gateway replica's exact in-flight count.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.engines.parse import MetricsSample, MetricsWindow
from gateway.routing.types import UNKNOWN_STATS, EngineStats, EngineView, Route
from specgate_lab.emulator.engine import Engine, EngineRequest, StepPlan


class ItlObserver:
    """Engine observer that keeps vLLM's inter-token-latency histogram as (sum, count)."""

    def __init__(self) -> None:
        self.itl_sum = 0.0
        self.itl_count = 0

    def on_step(self, plan: StepPlan, now: float) -> None:
        return None

    def on_first_token(self, req: EngineRequest) -> None:
        return None

    def on_tokens(self, req: EngineRequest, n: int, itl_s: float | None) -> None:
        if itl_s is not None:
            self.itl_sum += itl_s
            self.itl_count += 1

    def on_spec(self, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> None:
        return None

    def on_finished(self, req: EngineRequest) -> None:
        return None

    def on_prompt_tokens(self, n: int) -> None:
        return None


@dataclass
class SimMonitor:
    name: str
    route: Route
    engine: Engine
    window_s: float = 10.0
    tpot_sum: float = 0.0  # vllm:request_time_per_output_token_seconds (sum, count)
    tpot_count: int = 0
    itl: ItlObserver | None = None

    def __post_init__(self) -> None:
        self.window = MetricsWindow(window_s=self.window_s)
        self.stats: EngineStats | None = None

    def finished(self, tpot_s: float | None) -> None:
        if tpot_s is not None:
            self.tpot_sum += tpot_s
            self.tpot_count += 1

    def scrape(self, now: float) -> None:
        eng = self.engine
        st = eng.stats
        spec = eng.spec is not None
        sample = MetricsSample(
            drafts=float(st.num_drafts) if spec else None,
            draft_tokens=float(st.num_draft_tokens) if spec else None,
            accepted=float(st.num_accepted) if spec else None,
            per_position=tuple(float(x) for x in st.accepted_per_pos) if spec else None,
            running=float(eng.num_running),
            waiting=float(eng.num_waiting),
            kv_usage=eng.kv_usage(),
            generation_tokens=float(st.generation_tokens),
            prompt_tokens=float(st.prompt_tokens),
            tpot_sum=self.tpot_sum,
            tpot_count=float(self.tpot_count),
            itl_sum=self.itl.itl_sum if self.itl else None,
            itl_count=float(self.itl.itl_count) if self.itl else None,
            preemptions=float(st.preemptions),
        )
        self.stats = self.window.add(now, sample)

    def view(self, inflight: int) -> EngineView:
        """The engine as one gateway replica sees it: the shared scrape, and ``inflight``,
        the requests that replica itself has on the engine."""
        s = self.stats
        spec = self.engine.spec
        return EngineView(
            name=self.name,
            route=self.route,
            stale=s is None,
            inflight=inflight,
            method=spec.method if spec else None,
            k=spec.k if spec else 0,
            stats=s if s is not None else UNKNOWN_STATS,
        )
