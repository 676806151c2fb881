"""One pooled, keep-alive :class:`aiohttp.ClientSession` per engine."""

from __future__ import annotations

import aiohttp

from gateway.engines.runtime import EngineRuntime


class UpstreamPool:
    """Per engine: a session for requests, and a small separate one for control traffic
    (``/metrics`` scrapes, ``/health`` checks). Kept apart because aiohttp reuses idle
    connections oldest-first: once-a-second control traffic on the request pool would keep
    every connection opened at a load peak alive forever."""

    def __init__(self) -> None:
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._control: dict[str, aiohttp.ClientSession] = {}
        # engines that left (gateway.fleet): request sessions kept for requests still on them
        self._left: dict[str, list[aiohttp.ClientSession]] = {}

    def open(self, engines: list[EngineRuntime]) -> None:
        """Create the sessions (call on the running loop, at app startup)."""
        for rt in engines:
            if rt.name in self._sessions:
                continue
            connector = aiohttp.TCPConnector(
                limit=0,  # the gateway's own max_concurrency bounds connections
                keepalive_timeout=30.0,
                ttl_dns_cache=60,
            )
            self._sessions[rt.name] = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                auto_decompress=True,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                raise_for_status=False,
                # Never keep an engine's cookies: they would be sent on other clients' requests.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._control[rt.name] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=4, keepalive_timeout=30.0, ttl_dns_cache=60),
                timeout=aiohttp.ClientTimeout(total=None),
                skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    def session(self, name: str) -> aiohttp.ClientSession:
        s = self._sessions.get(name)
        if s is None and self._left.get(name):
            return self._left[name][-1]  # a request on an engine that left, still finishing
        if s is None:
            raise KeyError(name)
        return s

    def detach(self, name: str) -> tuple[aiohttp.ClientSession, ...]:
        """Engine ``name`` left: its sessions are no longer the name's (a new engine of that
        name gets its own) but still serve the requests on it. Returns them, for
        :meth:`close_detached` once those requests ended."""
        out = tuple(
            s for s in (self._sessions.pop(name, None), self._control.pop(name, None)) if s is not None
        )
        if out:
            self._left.setdefault(name, []).append(out[0])
        return out

    async def close_detached(self, name: str, sessions: tuple[aiohttp.ClientSession, ...]) -> None:
        left = self._left.get(name, [])
        for s in sessions:
            if s in left:
                left.remove(s)
            await s.close()
        if not left:
            self._left.pop(name, None)

    def control(self, name: str) -> aiohttp.ClientSession:
        """The session for scrapes and health checks of engine ``name``."""
        return self._control[name]

    def sessions(self) -> dict[str, aiohttp.ClientSession]:
        return dict(self._sessions)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        control, self._control = self._control, {}
        left, self._left = self._left, {}
        for s in [*sessions.values(), *control.values(), *(x for v in left.values() for x in v)]:
            await s.close()
