"""The discovery sources of each model, and the pairing rule they share.

**One pod is one pair** (``deploy/k8s/engines/*``: one container holds the GPU and runs both
engines): for each address a source finds, the pair ``<model>-<address>`` with its
speculative engine at ``address:spec.port`` and its plain engine at ``address:base.port``
(``discovery.spec`` / ``discovery.base`` give the rest of each engine's settings).
:class:`Discovery` runs one source per model that has ``discovery`` and restarts it when a
reload changes it; a source declares its whole set each time it changes
(:meth:`gateway.fleet.registry.FleetRegistry.declare`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from pydantic import ValidationError

from gateway.config.discovery import DiscoveryConfig, EngineTemplate, host_of
from gateway.config.models import EngineConfig, PairConfig
from gateway.fleet.found import Declare, Endpoint
from gateway.fleet.registry import FleetRegistry

log = logging.getLogger(__name__)


def family_ok(address: str, family: str) -> bool:
    try:
        version = ipaddress.ip_address(address).version
    except ValueError:
        return False
    return family == "any" or (family == "ipv4") == (version == 4)


def _engine(t: EngineTemplate, name: str, host: str, port: int) -> EngineConfig:
    return EngineConfig(
        name=name,
        url=f"{t.scheme}://{host}:{port}",
        served_model_name=t.served_model_name,
        api_key=t.api_key,
        method=t.method,
        k=t.k,
        prompt_lookup_min=t.prompt_lookup_min,
        prompt_lookup_max=t.prompt_lookup_max,
        endpoint=f"{host}:{port}",
    )


def discovered_pair(model: str, d: DiscoveryConfig, ep: Endpoint) -> PairConfig:
    """The pair of pod ``ep`` (the pairing rule above). Raises ValueError on a bad name."""
    key = f"{model}-{ep.address}"
    host = host_of(ep.address)
    spec = None
    if d.spec is not None:
        spec = _engine(d.spec, f"{key}-spec", host, ep.spec_port or d.spec.port)
    base = _engine(d.base, f"{key}-base", host, ep.base_port or d.base.port)
    device = ep.pod if ep.pod and d.device_from_pod else key
    return PairConfig(name=key, device=device, spec=spec, base=base)


class Source(Protocol):
    status: dict[str, object]

    async def run(self) -> None:
        """Find the pods for ever, declaring each new set (cancel to stop)."""


SourceFactory = Callable[[str, DiscoveryConfig, Declare], Source]


class Discovery:
    """One source per model with ``discovery`` (started on :meth:`start`)."""

    def __init__(
        self, registry: FleetRegistry, *, factories: Mapping[str, SourceFactory] | None = None, **kw: object
    ) -> None:
        self.registry = registry
        self._factories = dict(factories or {})
        self._kw = kw  # passed to the built-in sources (resolver=...)
        self._configs: dict[str, DiscoveryConfig] = {}
        self._sources: dict[str, Source] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._last: dict[str, frozenset[str]] = {}
        self.started = False

    def update(self, model: str, cfg: DiscoveryConfig | None) -> None:
        """Set ``model``'s discovery (None: none): a changed one restarts its source, and
        the pairs of a source that is gone leave."""
        old = self._configs.get(model)
        if old == cfg:
            return
        if old is not None:
            self._stop(model)
            if cfg is None or cfg.kind != old.kind:
                self.registry.declare(model, old.kind, {})
        if cfg is None:
            self._configs.pop(model, None)
            return
        self._configs[model] = cfg
        self._last.pop(model, None)
        if self.started:
            self._start(model)

    def start(self) -> None:
        self.started = True
        for model in self._configs:
            self._start(model)

    def _start(self, model: str) -> None:
        cfg = self._configs[model]
        factory = self._factories.get(cfg.kind) or _builtin(cfg.kind, self._kw)
        src = self._sources[model] = factory(model, cfg, lambda eps: self._declare(model, cfg, eps))
        self._tasks[model] = asyncio.get_running_loop().create_task(src.run(), name=f"discovery {model}")

    def _stop(self, model: str) -> None:
        task = self._tasks.pop(model, None)
        self._sources.pop(model, None)
        if task is not None:
            task.cancel()

    def _declare(self, model: str, cfg: DiscoveryConfig, endpoints: list[Endpoint]) -> None:
        pairs: dict[str, PairConfig] = {}
        for ep in endpoints:
            if not family_ok(ep.address, cfg.family):
                continue
            try:
                pc = discovered_pair(model, cfg, ep)
            except (ValidationError, ValueError) as exc:
                log.error("discovery %s: pod %s cannot be a pair: %s", model, ep.address, exc)
                continue
            pairs[pc.key] = pc
        keys = frozenset(pairs)
        if self._last.get(model) == keys:  # same pods: nothing to reconcile
            return
        self._last[model] = keys
        log.info("discovery %s (%s): %d pair pod(s)", model, cfg.kind, len(pairs))
        self.registry.declare(model, cfg.kind, pairs)

    def state(self, model: str) -> dict[str, object] | None:
        cfg = self._configs.get(model)
        if cfg is None:
            return None
        src = self._sources.get(model)
        return {"kind": cfg.kind, **(src.status if src is not None else {"running": False})}

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for model in list(self._tasks):
            self._stop(model)
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


def _builtin(kind: str, kw: Mapping[str, object]) -> SourceFactory:
    if kind == "dns":
        from gateway.fleet.dns import DnsSource

        resolver = kw.get("resolver")

        def dns(model: str, cfg: DiscoveryConfig, declare: Declare) -> Source:
            return DnsSource(model, cfg, declare, resolver=resolver if callable(resolver) else None)

        return dns

    from gateway.fleet.k8s import KubernetesSource

    return KubernetesSource
