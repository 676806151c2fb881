"""How each routed request ended, from Envoy's access log (:mod:`gateway.envoy.accesslog`).

An ext_proc stream shows the EPP as much of the response as its processing mode sends:
with the generated bootstrap the stream lasts to the response's end, but only a watched
few answers show their status; with the body sent without waiting (one round trip) Envoy
ends the stream at the routing, and in full duplex mode at the response headers. Envoy's
gRPC access log, streamed to the EPP (``specgate envoy-config --access-log``), gives every
request's end: its status, duration and the engine that served it, batched, off the
request's path.

While an access log stream is open from an Envoy (told apart by its address), each request
routed for that Envoy is *expected* (by its ``x-request-id``): Envoys that send no log
are finished as without it. When its ext_proc stream ends before the response does, its slot stays
held until its entry comes; when the stream ends with the response but without its status
(not watched), the slot goes and the request's telemetry waits for the entry. Either way
a request whose entry does not come in time is finished as it would be without the log:
the slot at its model's ``timeouts.total_s``, the telemetry ``GRACE_S`` after the end.
Requests routed before the first access log stream opened are finished as without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.envoy.accesslog import EMPTY_RESPONSE, LogEntry, parse_entry, split_logs
from gateway.envoy.protowire import ProtoError

if TYPE_CHECKING:
    from gateway.envoy.h2stream import Stream

log = logging.getLogger(__name__)

# How long after a response's end its entry may take: Envoy's flush interval (the bootstrap
# sets 0.1 s) with room for a busy Envoy.
GRACE_S = 5.0
LIMIT = 1 << 18  # requests expected at once, at most (beyond, finished as without the log)


class Ending(Protocol):
    """A routed request waiting for its entry (:class:`~gateway.api.epp.extproc.ExtProcStream`)."""

    @property
    def endpoints(self) -> str:
        """The endpoints it was routed to (``ip:port[,ip:port]``)."""
        ...

    def logged(self, entry: LogEntry) -> None:
        """Its entry came."""
        ...

    def missed(self) -> None:
        """Its entry did not come in time."""
        ...


Count = Callable[[str], None]  # counts an entry's result: matched, unmatched, missed


class Endings:
    """The requests expected in the access log, by ``x-request-id``."""

    def __init__(self, count: Count, *, limit: int = LIMIT) -> None:
        self._count = count
        self._limit = limit
        self._by_id: dict[str, list[Ending]] = {}
        self._size = 0
        # those whose ext_proc stream ended: when their entry is due, and their id
        self._deadlines: dict[Ending, tuple[float, str]] = {}
        self._hosts: dict[str, int] = {}  # access log streams open, by the Envoy's address

    @property
    def streams(self) -> int:
        """Access log streams open."""
        return sum(self._hosts.values())

    @property
    def live(self) -> bool:
        """An Envoy streams its access log here."""
        return bool(self._hosts)

    def opened(self, host: str) -> None:
        """An access log stream from the Envoy at ``host`` opened."""
        self._hosts[host] = self._hosts.get(host, 0) + 1

    def closed(self, host: str) -> None:
        n = self._hosts.get(host, 0) - 1
        if n > 0:
            self._hosts[host] = n
        else:
            self._hosts.pop(host, None)

    def __len__(self) -> int:
        return self._size

    @property
    def waiting(self) -> int:
        """Requests expected whose ext_proc stream has ended."""
        return len(self._deadlines)

    def expect(self, rid: str, ending: Ending, host: str) -> bool:
        """Wait for ``rid``'s entry, if the Envoy at ``host`` that asked for the request streams
        its access log here (and the bound allows)."""
        if host not in self._hosts or not rid or self._size >= self._limit:
            return False
        self._by_id.setdefault(rid, []).append(ending)
        self._size += 1
        return True

    def wait(self, rid: str, ending: Ending, deadline: float) -> None:
        """``ending``'s ext_proc stream is over: its entry is due by ``deadline``."""
        self._deadlines[ending] = (deadline, rid)

    def forget(self, rid: str, ending: Ending) -> None:
        """``ending`` was finished without its entry: an entry for it later is unmatched."""
        self._deadlines.pop(ending, None)
        waiting = self._by_id.get(rid)
        if waiting is None or ending not in waiting:
            return
        waiting.remove(ending)
        self._size -= 1
        if not waiting:
            del self._by_id[rid]

    def deliver(self, entries: list[LogEntry]) -> None:
        """Entries from Envoy: each to the request it ends. Two requests with one id (a
        client's own ``x-request-id``, kept by Envoy) are told apart by the engine that
        served them, else taken in order."""
        for entry in entries:
            if entry.intermediate:  # a long stream's periodic entry: not its end
                continue
            waiting = self._by_id.get(entry.request_id)
            if not waiting:
                self._count("unmatched")
                continue
            ending = waiting[0]
            if len(waiting) > 1 and entry.upstream:
                ending = next((e for e in waiting if entry.upstream in e.endpoints.split(",")), ending)
            self.forget(entry.request_id, ending)
            self._count("matched")
            try:
                ending.logged(entry)
            except Exception:
                log.exception("EPP: finishing a request from its access log entry failed")

    def undecodable(self) -> None:
        """An entry that could not be read: whichever request it ends will be missed."""
        self._count("undecodable")

    def expire(self, now: float) -> None:
        """Finish the requests whose entry is overdue."""
        due = [(e, rid) for e, (deadline, rid) in self._deadlines.items() if deadline <= now]
        for ending, rid in due:
            self.forget(rid, ending)
            self._count("missed")
            try:
                ending.missed()
            except Exception:
                log.exception("EPP: finishing a request without its access log entry failed")


class AccessLogStream:
    """The :class:`~gateway.envoy.h2.StreamHandler` of one ``AccessLogService/StreamAccessLogs``
    call: an Envoy worker's access log, for as long as it runs.

    Envoy sends entries in batches (up to its 16 KiB buffer: some thirty). They are read
    ``SLICE`` at a time, one slice per turn of the event loop, so that routing, whose
    messages may arrive meanwhile, never waits for a whole batch; at most ``BACKLOG`` wait
    (beyond, the newest are dropped: those requests end as without the log)."""

    SLICE = 4
    BACKLOG = 1 << 16

    def __init__(self, endings: Endings, stream: Stream) -> None:
        self.endings = endings
        self.stream = stream
        self._open = True
        self._backlog: deque[bytes] = deque()
        self._scheduled = False
        self._host = stream.conn.peer_host
        endings.opened(self._host)

    @property
    def awaiting(self) -> bool:
        return False  # Envoy logs when requests end: silence is no fault

    def on_message(self, message: bytes) -> None:
        try:
            raw = split_logs(message)
        except ProtoError:
            self.stream.abort(3, "undecodable StreamAccessLogsMessage")
            return
        room = self.BACKLOG - len(self._backlog)
        if len(raw) > room:
            log.warning(
                "EPP: %d access log entries waiting: %d dropped",
                len(self._backlog),
                len(raw) - room,
                extra={"throttle_key": "epp_access_log_backlog"},
            )
            raw = raw[:room]
        self._backlog.extend(raw)
        if self._backlog and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._read)

    @property
    def backlog(self) -> int:
        """Entries received, not read yet."""
        return len(self._backlog)

    def _read(self) -> None:
        backlog = self._backlog
        entries: list[LogEntry] = []
        for _ in range(min(self.SLICE, len(backlog))):
            try:
                entries.append(parse_entry(backlog.popleft()))
            except ProtoError:
                self.endings.undecodable()
        self.endings.deliver(entries)
        if backlog:
            asyncio.get_running_loop().call_soon(self._read)
        else:
            self._scheduled = False

    def on_end(self) -> None:
        self._closed()
        self.stream.send(EMPTY_RESPONSE)
        self.stream.finish()

    def on_reset(self) -> None:
        self._closed()

    def _closed(self) -> None:
        if self._open:
            self._open = False
            self.endings.closed(self._host)
