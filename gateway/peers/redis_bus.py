"""The peer channel through Redis: pub/sub for messages, a key with an expiry for the
leader's lease. Any Redis 5+ (or Valkey) will do; nothing is stored but the lease.

The client library is imported here only, so a gateway without ``peers.url`` needs none.
A lost connection is retried with a growing pause (0.5 s to 5 s); meanwhile ``receive``
waits and ``publish``/``lead`` fail, and each replica decides alone as without a channel.

A subscription counts once Redis has confirmed it: ``SUBSCRIBE`` only sends the command,
and what is published before Redis has processed it never reaches this replica. So
``start`` returns once subscribed (a replica started hears every message published after),
and a subscription made again after a lost connection is confirmed the same way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.peers.bus import BusClosed

log = logging.getLogger(__name__)

# Renew the lease only while holding it: compare and extend in one step.
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RESIGN = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""
_BACKOFF_S = (0.5, 5.0)


class RedisBus:
    def __init__(self, url: str, channel: str, *, timeout_s: float = 1.0) -> None:
        import redis.asyncio as aioredis

        self.channel = channel
        self.lease_key = f"{channel}:leader"
        self._timeout_s = timeout_s
        self._client: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, health_check_interval=30
        )
        self._pubsub: Any = None
        self._closed = False
        self._pause = _BACKOFF_S[0]
        self._renew: Any = self._client.register_script(_RENEW)
        self._resign: Any = self._client.register_script(_RESIGN)

    async def start(self) -> None:
        """Subscribe, and return once Redis has confirmed it (bounded by the timeout; if it
        fails, ``receive`` subscribes again)."""
        if self._pubsub is None:
            self._pubsub = await self._subscribe()

    async def _subscribe(self) -> Any:
        """A pub/sub connection subscribed to the channel, confirmed by Redis."""
        ps = self._client.pubsub()
        try:
            async with asyncio.timeout(self._timeout_s):
                await ps.subscribe(self.channel)
                # Redis answers SUBSCRIBE before any message of the channel on this connection
                while True:
                    msg = await ps.get_message(timeout=self._timeout_s)
                    if msg is not None and msg.get("type") == "subscribe":
                        break
        except BaseException:
            await self._discard(ps)
            raise
        return ps

    async def _discard(self, ps: Any) -> None:
        """Close a pub/sub connection (a broken one included), bounded."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await ps.aclose()
        except Exception:  # closing a broken connection
            pass

    async def close(self) -> None:
        self._closed = True
        ps, self._pubsub = self._pubsub, None
        if ps is not None:
            await self._discard(ps)
        await self._client.aclose()

    async def publish(self, data: bytes) -> None:
        await self._client.publish(self.channel, data)

    async def receive(self) -> bytes:
        while not self._closed:
            try:
                if self._pubsub is None:
                    self._pubsub = await self._subscribe()
                    if self._pause > _BACKOFF_S[0]:
                        log.warning("peer channel: subscribed again to %s", self.channel)
                    self._pause = _BACKOFF_S[0]
                msg = await self._pubsub.get_message(timeout=1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._closed:
                    break
                log.warning("peer channel: %s (retrying in %.1f s)", type(exc).__name__, self._pause)
                ps, self._pubsub = self._pubsub, None
                if ps is not None:
                    await self._discard(ps)  # its connection back, not left open
                await asyncio.sleep(self._pause)
                self._pause = min(_BACKOFF_S[1], 2.0 * self._pause)
                continue
            if msg is not None and msg.get("type") == "message" and isinstance(msg.get("data"), bytes):
                return bytes(msg["data"])
        raise BusClosed

    async def lead(self, me: str, ttl_s: float) -> bool:
        ms = max(1, int(ttl_s * 1000))
        if await self._client.set(self.lease_key, me, nx=True, px=ms):
            return True
        return bool(await self._renew(keys=[self.lease_key], args=[me, ms]))

    async def resign(self, me: str) -> None:
        await self._resign(keys=[self.lease_key], args=[me])
