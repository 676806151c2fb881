"""Discovery from DNS: a headless Service's A/AAAA records, every ``interval_s``.

A headless Service (``clusterIP: None``) resolves to the addresses of its pods; each is one
pair pod (:mod:`gateway.fleet.sources`). Resolution goes through the event loop's
``getaddrinfo`` (the system resolver, ``/etc/hosts`` included, in a thread: nothing new to
install). SRV records are not read: the ports come from the configuration
(``discovery.spec.port`` / ``discovery.base.port``), as the pair pods all listen on the same
ones.

A name that does not exist (``EAI_NONAME``: a headless Service with no pod) is an empty set:
its pairs leave. Any other failure (a resolver timeout, ``EAI_AGAIN``) keeps the last set:
a DNS hiccup must not drain the fleet.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from gateway.config.discovery import DiscoveryConfig
from gateway.fleet.found import Declare, Endpoint, stamp

log = logging.getLogger(__name__)

Resolver = Callable[[str], Awaitable[list[str]]]  # host name -> addresses

_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


async def system_resolver(host: str) -> list[str]:
    """``host``'s addresses through the loop's ``getaddrinfo`` (sorted, without duplicates)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(i[4][0]).split("%", 1)[0] for i in infos})


class DnsSource:
    def __init__(
        self, model: str, cfg: DiscoveryConfig, declare: Declare, *, resolver: Resolver | None = None
    ) -> None:
        assert cfg.host is not None  # DiscoveryConfig's rule for kind dns
        self.model = model
        self.cfg = cfg
        self.host: str = cfg.host
        self._declare = declare
        self._resolve = resolver or system_resolver
        self.status: dict[str, object] = {"host": cfg.host, "addresses": [], "last_ok": None, "error": None}

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.cfg.interval_s)

    async def poll_once(self) -> list[str] | None:
        """One resolution; declares and returns the addresses, or None (kept the last set)."""
        try:
            addrs = await self._resolve(self.host)
        except socket.gaierror as exc:
            if exc.errno not in _NO_SUCH_NAME:
                self._failed(f"{type(exc).__name__}: {exc}")
                return None
            addrs = []
        except OSError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return None
        self.status.update(addresses=list(addrs), last_ok=stamp(), error=None)
        self._declare([Endpoint(a) for a in addrs])
        return list(addrs)

    def _failed(self, error: str) -> None:
        if self.status.get("error") != error:
            log.warning(
                "discovery %s: cannot resolve %s (keeping the last pairs): %s", self.model, self.host, error
            )
        self.status["error"] = error
        return None
