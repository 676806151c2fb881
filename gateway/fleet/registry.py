"""The live set of each model's pairs: pairs join and leave while the gateway serves.

Sources *declare* the pairs they want for a model (the config file as ``"config"``, the
discovery sources as ``"dns"`` / ``"kubernetes"``); :meth:`FleetRegistry.declare` replaces
one source's set and reconciles the model:

- a declared pair that is not live **joins**: its runtime is built from the model's config,
  :class:`PairHooks` ``start`` opens its sessions and starts its scraper and health
  checker, and it is in the routing view from then on (the model's policy keeps serving:
  "a new pair starts from the model's learning");
- a live pair no source declares any more, or whose declaration changed, **leaves**: it
  drains. It leaves the routing view at once (no new request goes to it), its engines are
  marked draining for good, and the requests on it finish there (streams are not cut).
  Once it has none in flight, or after ``fleet.drain_timeout_s``, ``stop`` ends its
  scraper and health checker and it is gone; ``close`` releases its sessions once its last
  request ended (a request outliving the timeout still finishes);
- a declared pair whose engine names are still held by a leaving pair (a changed pair
  keeps its names) waits until that one is gone, then joins (``pending``).

Every change is told to the ``listeners`` as one :class:`PairsChanged` (model, pairs added,
leaving, gone): the hook the routing core uses to create and drop its per-pair state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config.discovery import FleetConfig
from gateway.config.models import PairConfig
from gateway.engines.runtime import ModelRuntime, PairRuntime, pair_runtime

log = logging.getLogger(__name__)

CONFIG = "config"  # the source name of the pairs listed in the configuration file


@dataclass(frozen=True, slots=True)
class PairsChanged:
    """One reconciliation's changes to a model's pairs (each tuple may be empty)."""

    model: str
    added: tuple[PairRuntime, ...] = ()  # now in the routing view
    leaving: tuple[PairRuntime, ...] = ()  # out of the routing view, draining
    gone: tuple[PairRuntime, ...] = ()  # drained (or timed out): scrapers stopped, removed

    @property
    def names(self) -> dict[str, list[str]]:
        return {k: [p.name for p in getattr(self, k)] for k in ("added", "leaving", "gone")}

    def __bool__(self) -> bool:
        return bool(self.added or self.leaving or self.gone)


Listener = Callable[[PairsChanged], None]


class PairHooks(Protocol):
    """What the application does for a pair's engines (:mod:`gateway.api.fleet`)."""

    def start(self, model: ModelRuntime, pair: PairRuntime, *, joined: bool) -> None:
        """Open its sessions, start its scraper and health checker (``joined``: while serving)."""

    async def stop(self, pair: PairRuntime) -> None:
        """Stop its scraper and health checker (its sessions stay for requests still on it)."""

    async def close(self, pair: PairRuntime) -> None:
        """Release its sessions: no request is on it any more."""


@dataclass
class _ModelFleet:
    declared: dict[str, dict[str, PairConfig]] = field(default_factory=dict)  # source -> key -> pair
    pending: dict[str, str] = field(default_factory=dict)  # key -> why it waits
    refused: dict[str, str] = field(default_factory=dict)  # key -> why it cannot join
    drains: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # leaving pair -> its drain
    gone: dict[str, asyncio.Event] = field(default_factory=dict)  # leaving pair -> set when gone


class FleetRegistry:
    def __init__(
        self,
        models: Mapping[str, ModelRuntime],
        config: FleetConfig,
        hooks: PairHooks | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.models = models
        self.config = config
        self.hooks = hooks
        self.listeners: list[Listener] = []
        self._clock = clock
        self._fleets: dict[str, _ModelFleet] = {}
        for name, m in models.items():
            for p in m.pairs:
                if p.config is not None:
                    p.source = CONFIG
            declared = {p.name: p.config for p in m.pairs if p.config is not None}
            self._fleets[name] = _ModelFleet(declared={CONFIG: declared})

    # -- declaring --------------------------------------------------------------------------
    def declare(self, model: str, source: str, pairs: Mapping[str, PairConfig]) -> PairsChanged:
        """Replace what ``source`` declares for ``model`` and reconcile (on the event loop)."""
        fleet = self._fleets[model]
        fleet.declared[source] = dict(pairs)
        return self.reconcile(model)

    def declared(self, model: str) -> dict[str, tuple[str, PairConfig]]:
        """key -> (source, pair) over every source; the config file's pairs win a clash."""
        out: dict[str, tuple[str, PairConfig]] = {}
        fleet = self._fleets[model]
        for source in sorted(fleet.declared, key=lambda s: (s != CONFIG, s)):
            for key, pc in fleet.declared[source].items():
                if key in out:
                    log.warning(
                        "model %s: pair %s of %s ignored: %s declares it", model, key, source, out[key][0]
                    )
                    continue
                out[key] = (source, pc)
        return out

    def reconcile(self, model: str) -> PairsChanged:
        mrt, fleet = self.models[model], self._fleets[model]
        want = self.declared(model)
        leaving = [
            p
            for p in mrt.active_pairs
            if p.name not in want or (p.config is not None and want[p.name][1] != p.config)
        ]
        for p in leaving:
            self._leave(mrt, p)
        live = {p.name for p in mrt.active_pairs}
        added: list[PairRuntime] = []
        fleet.pending.clear()
        fleet.refused.clear()
        for key, (source, pc) in want.items():
            if key in live:
                continue
            why = self._blocked(mrt, pc)
            if why is not None:
                (fleet.pending if why.startswith("waits") else fleet.refused)[key] = why
                continue
            pair = pair_runtime(mrt.config, pc, source=source, clock=self._clock)
            if self.hooks is not None:
                self.hooks.start(mrt, pair, joined=True)
            added.append(pair)
        if added:
            mrt.set_pairs([*mrt.pairs, *added])
        change = PairsChanged(model, tuple(added), tuple(leaving))
        for p in added:
            log.info("model %s: pair %s joined (%s)", model, p.name, p.source)
        for key, why in fleet.refused.items():
            log.error("model %s: pair %s cannot join: %s", model, key, why)
        self._tell(change)
        return change

    def _blocked(self, mrt: ModelRuntime, pc: PairConfig) -> str | None:
        """Why ``pc`` cannot join now ("waits ..." until a drain ends), or None."""
        names = {e.name for e in pc.engines}
        if any(p.name == pc.key for p in mrt.pairs):  # only a leaving pair, or it would be live
            return f"waits for pair {pc.key}'s previous version to drain"
        for other in self.models.values():
            for p in other.pairs:
                held = names & {e.name for e in p.engines}
                if held and p.leaving and other is mrt:
                    return f"waits for pair {p.name} (draining) to release engine {sorted(held)[0]}"
                if held:
                    return f"engine name {sorted(held)[0]} is taken by pair {p.name} of model {other.name}"
        speculates = {p.spec is not None for p in mrt.active_pairs}
        if speculates and (pc.spec is not None) not in speculates:
            return "the model's pairs have " + ("a spec engine" if pc.spec is None else "no spec engine")
        return None

    # -- leaving ----------------------------------------------------------------------------
    def _leave(self, mrt: ModelRuntime, pair: PairRuntime) -> None:
        fleet = self._fleets[mrt.name]
        pair.leave()
        log.info("model %s: pair %s leaves; draining %d request(s)", mrt.name, pair.name, pair.inflight)
        fleet.gone[pair.name] = asyncio.Event()
        fleet.drains[pair.name] = asyncio.get_running_loop().create_task(
            self._drain(mrt, pair), name=f"drain {pair.name}"
        )

    async def _drain(self, mrt: ModelRuntime, pair: PairRuntime) -> None:
        fleet = self._fleets[mrt.name]
        deadline = asyncio.get_running_loop().time() + self.config.drain_timeout_s
        try:
            if not await self._until_idle(pair, deadline):
                log.warning(
                    "model %s: pair %s still has %d request(s) after %.0f s; removed, they finish there",
                    mrt.name,
                    pair.name,
                    pair.inflight,
                    self.config.drain_timeout_s,
                )
            if self.hooks is not None:
                await self.hooks.stop(pair)
            mrt.set_pairs([p for p in mrt.pairs if p is not pair])
            log.info("model %s: pair %s is gone", mrt.name, pair.name)
            fleet.gone.pop(pair.name).set()
            self._tell(PairsChanged(mrt.name, gone=(pair,)))
            if fleet.pending:
                self.reconcile(mrt.name)
            await self._until_idle(pair, None)  # past the timeout: its connections close when they end
        finally:
            fleet.drains.pop(pair.name, None)
            if self.hooks is not None:
                await self.hooks.close(pair)

    async def _until_idle(self, pair: PairRuntime, deadline: float | None) -> bool:
        """Wait until no request is on ``pair`` (True) or ``deadline`` passed (False). Polled:
        the counts change in many places (attempts, moves, the EPP), none of which signals."""
        loop = asyncio.get_running_loop()
        while True:
            if pair.inflight <= 0:
                return True
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(self.config.drain_poll_s)

    async def wait_gone(self, model: str, pair: str) -> None:
        """Return once ``pair`` of ``model`` is gone (at once when it is not leaving)."""
        ev = self._fleets[model].gone.get(pair)
        if ev is not None:
            await ev.wait()

    # -- listeners, state, shutdown -----------------------------------------------------------
    def _tell(self, change: PairsChanged) -> None:
        if not change:
            return
        for listener in list(self.listeners):
            try:
                listener(change)
            except Exception:
                log.exception("pairs_changed listener failed")

    def state(self, model: str) -> dict[str, object]:
        fleet = self._fleets[model]
        return {
            "declared": {s: sorted(d) for s, d in fleet.declared.items()},
            "pending": dict(fleet.pending),
            "refused": dict(fleet.refused),
            "draining": sorted(fleet.drains),
        }

    async def close(self) -> None:
        """Shutdown: end the drains (the gateway's own drain waits for the requests)."""
        tasks = [t for f in self._fleets.values() for t in f.drains.values()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
