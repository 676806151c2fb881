"""A pair shared with other gateway replicas: others' load read from the scrapes, and a
replica speculating alone coming back to plain."""

from __future__ import annotations

from dataclasses import replace

from gateway.routing.adaptive.shared import SharedPair
from gateway.routing.types import EngineStats, EngineView, Route


def engine(route: Route, inflight: int, running: float | None, at: float) -> EngineView:
    stats = EngineStats(at=at, running=running, waiting=0.0)
    return EngineView(name=route.value, route=route, inflight=inflight, stats=stats)


def test_others_load_is_the_scrape_beyond_this_replicas_own_requests() -> None:
    sp = SharedPair()
    # this replica sent 3 requests to spec by t=9.5; the scrape at t=10 shows 3 running
    for i, t in enumerate((9.0, 9.2, 9.5)):
        sp.record(t, engine(Route.SPEC, i, None, 0), engine(Route.BASE, 0, None, 0), Route.SPEC)
    # by t=11 two of them finished: the stale scrape's 3 are still all its own
    dv = sp.view(engine(Route.SPEC, 1, 3.0, at=10.0), engine(Route.BASE, 0, 0.0, at=10.0), 11.0)
    assert dv.foreign_spec <= 0.0 and not dv.runs_base and dv.runs_spec
    assert not sp.shared(11.0)
    # another replica's two requests on plain
    dv = sp.view(engine(Route.SPEC, 1, 3.0, at=10.0), engine(Route.BASE, 0, 2.0, at=10.0), 11.0)
    assert dv.foreign_base == 2.0 and dv.split and sp.shared(11.0) and sp.shared(70.0)
    assert not sp.shared(72.0)


def test_a_replica_speculating_alone_comes_back_and_backs_off() -> None:
    sp = SharedPair()
    spec, base = engine(Route.SPEC, 2, 2.0, at=0.0), engine(Route.BASE, 0, 3.0, at=0.0)
    dv = sp.view(spec, base, 0.0)  # others run 3 requests on plain
    assert not sp.back_to_plain(dv, speculating=True, duration_s=2.0, now=0.0)
    assert not sp.back_to_plain(dv, speculating=True, duration_s=2.0, now=1.9)  # their own flip may come
    assert sp.back_to_plain(dv, speculating=True, duration_s=2.0, now=2.1)
    assert sp.blocked_until == 12.1  # no try at spec for 10 s
    assert not sp.back_to_plain(dv, speculating=True, duration_s=2.0, now=20.0)
    assert sp.back_to_plain(dv, speculating=True, duration_s=2.0, now=22.5)
    assert sp.blocked_until == 42.5  # the back-off doubles
    # with nobody on plain, spec holds
    alone = sp.view(spec, engine(Route.BASE, 0, 0.0, at=0.0), 50.0)
    assert not sp.back_to_plain(alone, speculating=True, duration_s=2.0, now=50.0)


def test_requests_this_replica_stopped_relaying_are_not_anothers() -> None:
    """A flip moves this replica's streams off spec: the engine aborts them at its next
    step, so a scrape taken just after still counts them. Those closed within a second
    before the scrape are this replica's; a count beyond them is another replica's."""
    sp = SharedPair()
    sp.record(29.0, engine(Route.SPEC, 60, None, 0), engine(Route.BASE, 0, None, 0), Route.SPEC)
    sp.record(29.5, engine(Route.SPEC, 0, None, 0), engine(Route.BASE, 60, None, 0), Route.BASE)
    moved = tuple(29.6 + i * 0.001 for i in range(12))  # 12 closed at 29.6, scraped at 30.0
    spec = EngineView(
        name="spec",
        route=Route.SPEC,
        inflight=0,
        closed_at=moved,
        stats=EngineStats(at=30.0, running=12.0, waiting=0.0),
    )
    dv = sp.view(spec, engine(Route.BASE, 61, 61.0, at=30.0), 30.2)
    assert dv.foreign_spec == 0.0 and not sp.shared(30.2)
    # the same closes two seconds before a scrape that still shows 12: someone else's
    late = replace(spec, stats=EngineStats(at=31.7, running=12.0, waiting=0.0))
    dv = sp.view(late, engine(Route.BASE, 61, 61.0, at=31.7), 31.8)
    assert dv.foreign_spec == 12.0 and sp.shared(31.8)
