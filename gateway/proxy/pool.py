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
        return self._sessions[name]

    def control(self, name: str) -> aiohttp.ClientSession:
        """The session for scrapes and health checks of engine ``name``."""
        return self._control[name]

    def sessions(self) -> dict[str, aiohttp.ClientSession]:
        return dict(self._sessions)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        control, self._control = self._control, {}
        for s in [*sessions.values(), *control.values()]:
            await s.close()
