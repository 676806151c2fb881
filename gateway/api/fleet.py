"""The application's side of :mod:`gateway.fleet`: each pair's sessions, scraper and health
checker (:class:`PairWorkers`, the registry's hooks), and a new configuration applied live
(:func:`apply_config`, the reloader's ``apply``), and the streams a regime flip moves on
one pair of many (:func:`ask_moves`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.api.state import GatewayState
from gateway.config.models import GatewayConfig
from gateway.engines.runtime import EngineRuntime, ModelRuntime, PairRuntime
from gateway.fleet.registry import CONFIG
from gateway.placement import FleetPolicy
from gateway.routing.types import Decision
from gateway.telemetry.wiring import with_scrape_telemetry

log = logging.getLogger(__name__)


def _scrape_sink(rt: EngineRuntime) -> Callable[[Any], None]:
    def update(s: Any) -> None:  # a gateway.engines.stats.ScrapeState
        rt.scrape = s

    return update


def _health_sink(rt: EngineRuntime) -> Callable[[bool], None]:
    def change(healthy: bool) -> None:
        rt.active_healthy = healthy
        log.warning("engine %s is %s", rt.name, "up" if healthy else "DOWN (health check)")

    return change


class PairWorkers:
    """Per engine: its pooled sessions, and (``scrape.enabled``) a ``/metrics`` scraper and
    an active health checker. An engine of a pair that joins while serving starts down, and
    takes requests from its first good health check (a pod still loading its model gets none)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self._workers: dict[EngineRuntime, list[Any]] = {}
        self._detached: dict[EngineRuntime, tuple[aiohttp.ClientSession, ...]] = {}

    def start(self, model: ModelRuntime, pair: PairRuntime, *, joined: bool) -> None:
        st = self.state
        st.pool.open(list(pair.engines))
        for rt in pair.engines:
            if st.peers is not None:
                st.peers.adopt(rt)
            if st.config.scrape.enabled:
                if joined:
                    rt.active_healthy = False
                self._workers[rt] = self._start_engine(rt, healthy=not joined)

    def _start_engine(self, rt: EngineRuntime, *, healthy: bool) -> list[Any]:
        from gateway.engines.health import HealthChecker
        from gateway.engines.scraper import MetricsScraper

        st, sc = self.state, self.state.config.scrape
        session = st.pool.control(rt.name)  # not the request pool: see UpstreamPool
        scraper = MetricsScraper(
            session,
            rt.config.url,
            model_name=rt.config.served_model_name,
            interval_s=sc.interval_s,
            timeout_s=sc.timeout_s,
            window_s=sc.window_s,
            stale_after_s=sc.stale_after_s,
            headers=rt.config.auth_headers() or None,
            on_update=with_scrape_telemetry(_scrape_sink(rt), st.telemetry, rt.name),
        )
        checker = HealthChecker(
            session,
            rt.config.url,
            interval_s=sc.interval_s,
            timeout_s=max(sc.timeout_s, 1.0),
            initially_healthy=healthy,
            on_change=_health_sink(rt),
        )
        scraper.start()
        checker.start()
        return [scraper, checker]

    @property
    def watched(self) -> set[str]:
        """The engines being scraped and health-checked now."""
        return {rt.name for rt in self._workers}

    async def stop(self, pair: PairRuntime) -> None:
        for rt in pair.engines:
            for w in self._workers.pop(rt, []):
                with contextlib.suppress(Exception):
                    await w.stop()
            self._detached[rt] = self.state.pool.detach(rt.name)

    async def close(self, pair: PairRuntime) -> None:
        for rt in pair.engines:
            sessions = self._detached.pop(rt, ())
            await self.state.pool.close_detached(rt.name, sessions)

    async def stop_all(self) -> None:
        workers, self._workers = self._workers, {}
        for ws in workers.values():
            for w in ws:
                with contextlib.suppress(Exception):
                    await w.stop()


def apply_config(state: GatewayState, new: GatewayConfig) -> None:
    """Make ``new`` (an effective configuration: :func:`gateway.fleet.reload.plan`) the one
    serving: each model's settings read per request, its declared pairs, its discovery."""
    state.config = new
    if state.fleet is not None:
        state.fleet.config = new.fleet
    for m in new.models:
        mrt = state.models.get(m.name)
        if mrt is None:  # models are not added live: plan() keeps the old list
            continue
        mrt.config = m
        if state.fleet is not None:
            state.fleet.declare(m.name, CONFIG, {p.key: p for p in m.pairs})
        if state.discovery is not None:
            state.discovery.update(m.name, m.discovery)


def ask_moves(st: GatewayState, mrt: ModelRuntime, decision: Decision) -> None:
    """Streams that a regime flip leaves on the old engine move to its sibling: on one pair,
    every stream on the old route; on several, the flipped pair's old engine only (the
    decision's sibling), and the engines of the pairs the fleet's plan flipped."""
    engines = mrt.policy.take_moves() if isinstance(mrt.policy, FleetPolicy) else []
    if not mrt.config.routing.move_on_flip:
        return
    board = st.moves.get(mrt.name)
    if decision.move_from is not None:
        if board is None:
            asked = 0
        elif len(mrt.active_pairs) > 1:
            asked = board.move(engine=decision.fallback).moving if decision.fallback else 0
        else:
            asked = board.move(decision.move_from).moving
        log.info("regime flip: %d stream(s) asked to leave the %s engine", asked, decision.move_from.value)
    for engine in engines:
        asked = board.move(engine=engine).moving if board is not None else 0
        log.info("fleet regime flip: %d stream(s) asked to leave engine %s", asked, engine)
