"""Envoy's access log at the EPP: its wire format, the requests it ends, and the EPP's use
of it over a real gRPC call (no Envoy here: ``test_access_log_e2e.py`` runs real Envoy)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.epp.endings import Endings
from gateway.api.epp.server import EPP
from gateway.config import GatewayConfig
from gateway.envoy.accesslog import LogEntry, parse_entry, parse_logs, split_logs
from gateway.envoy.protowire import ProtoError, ld, uint
from tests.epp.extproc_wire import (
    access_log_call,
    access_log_message,
    log_entry,
    request_body,
    request_headers,
)
from tests.epp.test_extproc import TIMEOUT_S, Epp, _statuses, _telemetry, chat, counter, running

GOLDEN = json.loads((Path(__file__).parent / "fixtures" / "access_log_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["messages"], ids=lambda c: c["request_id"])
def test_entries_read_as_envoy_wrote_them(case: dict[str, Any]) -> None:
    (entry,) = parse_logs(bytes.fromhex(case["hex"]))
    assert (entry.request_id, entry.status, entry.upstream, entry.details, entry.error) == (
        case["request_id"],
        case["status"],
        case["upstream"],
        case["details"],
        case["error"],
    )
    assert entry.duration_s is not None and 0 < entry.duration_s < 1
    assert not entry.intermediate


def test_flags_name_what_ended_a_request_and_garbage_is_refused() -> None:
    msg = access_log_message(
        log_entry("a", 200, "10.0.0.1:8000", flags=(15,)),  # downstream connection termination
        log_entry("b", 0, "10.0.0.1:8000", flags=(5,)),  # upstream remote reset
        log_entry("c", 503, details="no_healthy_upstream", flags=(2,)),
        log_entry("d", intermediate=True),
        identifier=True,
    )
    entries = parse_logs(msg)
    assert [(e.request_id, e.status, e.error) for e in entries] == [
        ("a", 200, "client_disconnected"),
        ("b", 0, "upstream_reset"),
        ("c", 503, "upstream_unavailable"),
        ("d", 200, None),
    ]
    assert entries[3].intermediate and entries[0].duration_s == pytest.approx(0.25)
    with pytest.raises(ProtoError):
        parse_logs(b"\x12\xff\x01abc")  # a length beyond the message


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=12),
            st.builds(lambda f, b: ld(f, b), st.integers(1, 40), st.binary(max_size=200)),
            st.builds(lambda f, v: uint(f, v), st.integers(1, 40), st.integers(0, 1 << 40)),
            st.sampled_from([bytes.fromhex(c["hex"]) for c in GOLDEN["messages"]]),
        ),
        max_size=6,
    ).map(b"".join)
)
def test_the_entry_reader_reads_any_bytes_or_refuses_them(data: bytes) -> None:
    """Whatever Envoy (or anything on the EPP's port) sends: entries read as the general
    field reader sees the message, or a ProtoError, never another exception."""
    try:
        raws = split_logs(data)
    except ProtoError:
        return
    for raw in raws:
        try:
            entry = parse_entry(raw)
        except ProtoError:
            continue
        assert isinstance(entry.request_id, str) and isinstance(entry.status, int)
        assert entry.duration_s is None or entry.duration_s >= 0


@dataclass(eq=False)  # told apart by identity, as the EPP's streams are
class Req:
    endpoints: str = "10.0.0.1:8000,10.0.0.2:8000"
    got: list[LogEntry] = field(default_factory=list)
    missed_: int = 0

    def logged(self, entry: LogEntry) -> None:
        self.got.append(entry)

    def missed(self) -> None:
        self.missed_ += 1


def _entry(rid: str, upstream: str = "", intermediate: bool = False) -> LogEntry:
    return LogEntry(rid, 200, upstream, 0.1, None, "via_upstream", intermediate)


def _endings() -> tuple[Endings, list[str]]:
    counted: list[str] = []
    return Endings(counted.append, limit=3), counted


def test_requests_are_expected_only_while_an_access_log_streams() -> None:
    endings, counted = _endings()
    r = Req()
    assert not endings.expect("a", r, "envoy-a")  # no access log: finished without it
    endings.opened("envoy-a")
    assert endings.expect("a", r, "envoy-a") and len(endings) == 1
    endings.deliver([_entry("a", intermediate=True)])  # a long stream's periodic entry: not its end
    assert r.got == []
    endings.deliver([_entry("a"), _entry("zzz")])
    assert [e.request_id for e in r.got] == ["a"] and len(endings) == 0
    assert counted == ["matched", "unmatched"]
    # bounded: beyond the limit, requests are finished without the log
    assert [endings.expect(str(i), Req(), "envoy-a") for i in range(4)] == [True, True, True, False]


def test_only_the_requests_of_an_envoy_that_sends_its_log_are_expected() -> None:
    """Envoys are told apart by their address: one that sends no access log (configured
    without it) has its requests finished as without the log, not held for total_s."""
    endings, _ = _endings()
    endings.opened("10.0.0.7")
    endings.opened("10.0.0.7")  # a second worker of the same Envoy
    assert endings.expect("a", Req(), "10.0.0.7")
    assert not endings.expect("b", Req(), "10.0.0.8")
    endings.closed("10.0.0.7")
    assert endings.live and endings.streams == 1
    endings.closed("10.0.0.7")
    assert not endings.live and not endings.expect("c", Req(), "10.0.0.7")


def test_one_id_twice_is_told_apart_by_the_engine_that_served() -> None:
    endings, _ = _endings()
    endings.opened("envoy-a")
    first, second = Req("10.0.0.1:8000"), Req("10.0.0.2:8000,10.0.0.1:8000")
    endings.expect("same", first, "envoy-a")
    endings.expect("same", second, "envoy-a")
    endings.deliver([_entry("same", "10.0.0.2:8000")])
    assert (first.got, len(second.got)) == ([], 1)
    endings.deliver([_entry("same")])  # no engine named: the oldest
    assert len(first.got) == 1


def test_a_request_whose_entry_is_overdue_is_finished_without_it_once() -> None:
    endings, counted = _endings()
    endings.opened("envoy-a")
    late, kept = Req(), Req()
    endings.expect("late", late, "envoy-a")
    endings.expect("kept", kept, "envoy-a")
    endings.wait("late", late, deadline=10.0)
    endings.wait("kept", kept, deadline=20.0)
    endings.expire(9.9)
    assert late.missed_ == 0
    endings.expire(10.0)
    endings.expire(11.0)
    assert (late.missed_, kept.missed_) == (1, 0)
    endings.deliver([_entry("late")])  # too late: finished already
    assert late.got == [] and counted == ["missed", "unmatched"]
    assert len(endings) == 1


# -- the EPP over gRPC: the ext_proc call and the access log call, as Envoy makes them -------


class Turns:
    """The EPP reads a call's messages on later loop turns: each stream opened, request left
    waiting for its entry and entry delivered is told here, to wait for what they lead to."""

    def __init__(self, app: Any) -> None:
        self.event = asyncio.Event()
        server = app[EPP]
        ends = server.endings
        server.open_stream = self._told(server.open_stream)
        ends.wait = self._told(ends.wait)
        ends.deliver = self._told(ends.deliver)

    def _told(self, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            out = f(*args)
            self.event.set()
            return out

        return call

    async def until(self, cond: Callable[[], bool]) -> None:
        async with asyncio.timeout(TIMEOUT_S):
            while not cond():
                self.event.clear()
                await self.event.wait()


async def _one_trip(e: Epp, rid: str) -> None:
    """A request routed in one round trip, then Envoy's reset (the stream's end, the answer
    still to come)."""
    async with e.call() as c:
        await c.send(request_headers(streamed=True, without_waiting=True, headers={"x-request-id": rid}))
        await c.send(request_body(chat(temperature=0.0)))
        assert [(await c.read()).kind for _ in range(2)] == ["request_headers", "request_body"]
        c.raw.cancel()


async def test_the_access_log_ends_a_one_trip_request_with_its_status_and_engine(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0, "epp.observe_per_s": 0})
    async with running(cfg, _telemetry()) as e:
        turns = Turns(e.app)  # before the channel's connection: it takes the EPP's services then
        log = access_log_call(e.channel)
        await log.write(access_log_message(identifier=True))
        epp = e.state  # the gateway's state: in-flight counts
        ends = e.app[EPP].endings
        await turns.until(lambda: ends.live)
        await _one_trip(e, "r-ok")
        await _one_trip(e, "r-cut")
        await _one_trip(e, "r-lost")
        await turns.until(lambda: len(ends._deadlines) == 3)
        # The stream is over, the answers are not: the slots stay held.
        assert epp.inflight == 3
        async with aiohttp.ClientSession() as session, session.get(f"{e.http}/admin/state") as resp:
            state = await resp.json()
        assert state["epp"]["access_log"] == {"streams": 1, "expected": 3, "stream_ended": 3}
        base = e.addr["base0"]
        spec = e.addr["spec0"]
        await log.write(
            access_log_message(
                log_entry("r-ok", 200, spec, duration_s=1.5),  # served by the sibling
                log_entry("r-cut", 200, base, flags=(15,)),  # the client left mid-answer
                log_entry("nobody", 200, base),
            )
        )
        await turns.until(lambda: epp.inflight == 1)
        assert _engine_inflight(e) == {"base0": 1, "spec0": 0}
        ends.expire(time.monotonic() + 1e6)  # r-lost's entry never comes: finished without it
        assert epp.inflight == 0
        assert await _statuses(e) == {"200": 1, "499": 1, "unobserved": 1}
        assert await _counted(e) == {"matched": 2, "unmatched": 1, "missed": 1}
        log.cancel()


def _engine_inflight(e: Epp) -> dict[str, int]:
    return {x.name: x.inflight for x in e.state.engines}


async def _counted(e: Epp) -> dict[str, float]:
    """specgate_epp_access_log_entries_total by result."""
    return await counter(e, "specgate_epp_access_log_entries", "result")
