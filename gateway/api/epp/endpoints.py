"""Which ``ip:port`` Envoy knows each engine by, and back.

The Endpoint Picker names engines to Envoy by address (the InferencePool's endpoints are
pod addresses). An engine's ``endpoint`` setting is that address; without it, the url's
host and port, a host name resolved when the EPP starts and again every
``REFRESH_S`` (a restarted pod behind a headless Service comes back at another address).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from gateway.engines.runtime import EngineRuntime

log = logging.getLogger(__name__)

REFRESH_S = 5.0


def _literal(host: str, port: int) -> str | None:
    """``ip:port`` when ``host`` is an IP literal (IPv6 in brackets), else None."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return host, port


class EndpointBook:
    """engine name ↔ ``ip:port``."""

    def __init__(self, engines: Iterable[EngineRuntime]) -> None:
        self.engines = {e.name: e for e in engines}
        self._by_engine: dict[str, str] = {}
        self._by_address: dict[str, EngineRuntime] = {}
        self._names: dict[str, tuple[str, int]] = {}  # engines whose url names a host to resolve
        for e in list(self.engines.values()):
            self.add(e)

    def add(self, e: EngineRuntime) -> None:
        """Know engine ``e`` (at start, or when its pair joins: gateway.fleet)."""
        self.engines[e.name] = e
        if e.config.endpoint is not None:
            self._set(e, e.config.endpoint)
            return
        host, port = _host_port(e.config.url)
        addr = _literal(host, port)
        if addr is not None:
            self._set(e, addr)
        else:
            self._names[e.name] = (host, port)

    def remove(self, name: str) -> None:
        """Forget engine ``name`` (its pair is gone): its address names nothing any more."""
        e = self.engines.pop(name, None)
        self._names.pop(name, None)
        addr = self._by_engine.pop(name, None)
        if addr is not None and e is not None and self._by_address.get(addr) is e:
            del self._by_address[addr]

    def _set(self, engine: EngineRuntime, addr: str) -> None:
        old = self._by_engine.get(engine.name)
        if old == addr:
            return
        if old is not None:
            self._by_address.pop(old, None)
        self._by_engine[engine.name] = addr
        self._by_address[addr] = engine
        if old is not None:
            log.info("EPP: engine %s is now at %s (was %s)", engine.name, addr, old)

    def address(self, engine: str) -> str | None:
        return self._by_engine.get(engine)

    def engine_at(self, addr: str) -> EngineRuntime | None:
        return self._by_address.get(addr.strip())

    @property
    def complete(self) -> bool:
        """Every engine's address is known."""
        return len(self._by_engine) == len(self.engines)

    @property
    def unresolved(self) -> list[str]:
        return [n for n in self._names if n not in self._by_engine]

    async def resolve(self) -> None:
        """Look up the engines named by host name (each failure logged, the old address kept)."""
        loop = asyncio.get_running_loop()
        for name, (host, port) in self._names.items():
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                log.warning("EPP: cannot resolve engine %s's host %r: %s", name, host, exc)
                continue
            addrs = sorted({str(i[4][0]) for i in infos})
            if addrs:
                addr = _literal(addrs[0], port)
                if addr is not None:
                    self._set(self.engines[name], addr)

    async def keep_resolving(self, interval_s: float = REFRESH_S) -> None:
        while self._names:
            await self.resolve()
            await asyncio.sleep(interval_s)
