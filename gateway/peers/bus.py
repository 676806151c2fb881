"""The peer channel's transport: publish to every replica, receive from them, and one
leader's lease. :class:`MemoryHub` joins replicas in one process (tests, demos);
:class:`gateway.peers.redis_bus.RedisBus` joins replicas through Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class BusClosed(Exception):
    """The bus was closed: nothing more will be received."""


class PeerBus(Protocol):
    async def start(self) -> None:
        """Join the channel: once it returns, every message published after is received."""
        ...

    async def close(self) -> None: ...

    async def publish(self, data: bytes) -> None:
        """To every replica on the channel (this one included)."""
        ...

    async def receive(self) -> bytes:
        """The next message; waits for one (reconnecting as needed); BusClosed once closed."""
        ...

    async def lead(self, me: str, ttl_s: float) -> bool:
        """Take or renew the leader's lease for ``ttl_s``; whether ``me`` holds it."""
        ...

    async def resign(self, me: str) -> None:
        """Give the lease up if ``me`` holds it."""
        ...


class MemoryHub:
    """Replicas in one process: every bus made here hears every other's messages."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, *, max_queued: int = 100_000) -> None:
        self.clock = clock
        self.max_queued = max_queued
        self.buses: list[MemoryBus] = []
        self.holder: str | None = None
        self.expires = 0.0
        self.delivered = 0

    def bus(self) -> MemoryBus:
        b = MemoryBus(self)
        self.buses.append(b)
        return b


class MemoryBus:
    def __init__(self, hub: MemoryHub) -> None:
        self.hub = hub
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(hub.max_queued)
        self.closed = False

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True
        self.hub.buses.remove(self)
        self.queue.put_nowait(None)

    async def publish(self, data: bytes) -> None:
        for b in self.hub.buses:
            if not b.closed and not b.queue.full():
                b.queue.put_nowait(data)
                self.hub.delivered += 1

    async def receive(self) -> bytes:
        if self.closed:
            raise BusClosed
        data = await self.queue.get()
        if data is None:
            raise BusClosed
        return data

    async def lead(self, me: str, ttl_s: float) -> bool:
        hub, now = self.hub, self.hub.clock()
        if hub.holder is None or hub.holder == me or now >= hub.expires:
            hub.holder, hub.expires = me, now + ttl_s
        return hub.holder == me

    async def resign(self, me: str) -> None:
        if self.hub.holder == me:
            self.hub.holder = None
