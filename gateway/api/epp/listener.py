"""The EPP's listening socket: who gets a connection, and how fast.

The gateway's own accept loop (not ``loop.create_server``) so that connections can be
turned away before any protocol object exists and the accept rate can be held back by not
accepting (the kernel's backlog waits):

- at most ``max_connections`` at once; more are closed as they come;
- a peer (by address) whose connection was ended for crossing a budget (GOAWAY
  ENHANCE_YOUR_CALM) or for a protocol error is refused for a cool-down that doubles with
  each strike (1 s, 2 s, ... up to 60 s), so that reconnecting does not buy a flood a fresh
  budget every time;
- at most ``accepts_per_s`` connections accepted a second (a burst of as many), refused
  ones included: past it the next waits in the kernel's backlog;
- a refused socket is closed in a worker thread: its close frees what the peer sent before
  it was accepted (a flood's bytes), kernel work the event loop need not wait for.

TLS handshakes run each in its own task, so a peer that stalls its handshake holds no one
else's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

_MAX_COOLDOWN_S = 60.0
_TLS_HANDSHAKE_S = 10.0


class Listener:
    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        *,
        max_connections: int,
        accepts_per_s: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.factory = factory
        self.max_connections = max_connections
        self.tls = tls
        self.open = 0  # connections made and not yet lost (the factory's owner counts them)
        self.refused = 0
        self._rate = accepts_per_s
        self._tokens = accepts_per_s
        self._last = time.monotonic()
        self._strikes: dict[str, tuple[float, int]] = {}  # peer -> (refused until, strikes)
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._closer: ThreadPoolExecutor | None = None

    def _refuse(self, sock: socket.socket) -> None:
        self.refused += 1
        if self._closer is None:
            self._closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="epp-refuse")
        self._closer.submit(sock.close)

    def strike(self, host: str, now: float) -> None:
        """``host`` crossed a budget or broke the protocol: refuse it for a while (longer each
        time)."""
        _, n = self._strikes.get(host, (0.0, 0))
        cooldown = min(_MAX_COOLDOWN_S, 2.0**n)
        self._strikes[host] = (now + cooldown, n + 1)
        log.warning(
            "EPP: refusing connections from %s for %.0f s (it crossed a budget or broke HTTP/2)",
            host or "?",
            cooldown,
            extra={"throttle_key": "epp_strike"},
        )

    def forgive(self, now: float) -> None:
        """Forget the strikes of peers quiet for a minute past their cool-down."""
        for host, (until, _) in list(self._strikes.items()):
            if now - until > _MAX_COOLDOWN_S:
                del self._strikes[host]

    def refusing(self, host: str, now: float) -> bool:
        until = self._strikes.get(host, (0.0, 0))[0]
        return now < until

    async def start(self, host: str, port: int) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=4096)
        sock.setblocking(False)
        self._sock = sock
        self._task = asyncio.get_running_loop().create_task(self._accept())
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for t in list(self._handshakes):
            t.cancel()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._closer is not None:
            self._closer.shutdown(wait=False)
            self._closer = None

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                sock, addr = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of file descriptors, ...: wait, then go on
                log.warning("EPP: accept failed: %s", exc, extra={"throttle_key": "epp_accept"})
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            # Every accept counts, refused ones too: a storm of reconnections waits in the
            # kernel's backlog instead of costing the loop an accept and a close each.
            self._tokens = min(self._rate, self._tokens + (now - self._last) * self._rate)
            self._last = now
            self._tokens -= 1.0
            if self._tokens < 0.0:  # over the accept rate: wait before accepting more
                await asyncio.sleep(-self._tokens / self._rate)
                now = time.monotonic()
            host = addr[0] if isinstance(addr, tuple) and addr else ""
            if self.refusing(host, now) or self.open + len(self._handshakes) >= self.max_connections:
                self._refuse(sock)
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is None:
                try:
                    await loop.connect_accepted_socket(self.factory, sock)
                except OSError:
                    sock.close()
                continue
            task = loop.create_task(self._handshake(sock))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self.factory, sock, ssl=self.tls, ssl_handshake_timeout=_TLS_HANDSHAKE_S
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError):
            sock.close()
