"""One pooled, keep-alive :class:`aiohttp.ClientSession` per engine."""

from __future__ import annotations

import aiohttp

from gateway.engines.runtime import EngineRuntime


class UpstreamPool:
    def __init__(self) -> None:
        self._sessions: dict[str, aiohttp.ClientSession] = {}

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

    def session(self, name: str) -> aiohttp.ClientSession:
        return self._sessions[name]

    def sessions(self) -> dict[str, aiohttp.ClientSession]:
        return dict(self._sessions)

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for s in sessions.values():
            await s.close()
