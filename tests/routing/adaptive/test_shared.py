"""A pair shared with other gateway replicas: others' load read from the scrapes, and a
replica speculating alone coming back to plain."""

from __future__ import annotations

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
    # another replica's two requests on plain: seen in one scrape, the pair runs split, but
    # it counts as shared once a second scrape still shows them
    dv = sp.view(engine(Route.SPEC, 1, 3.0, at=10.0), engine(Route.BASE, 0, 2.0, at=10.0), 11.0)
    assert dv.foreign_base == 2.0 and dv.split and not sp.shared(11.0)
    dv = sp.view(engine(Route.SPEC, 1, 3.0, at=10.0), engine(Route.BASE, 0, 2.0, at=10.0), 11.2)
    assert not sp.shared(11.2)  # the same scrape read again
    sp.view(engine(Route.SPEC, 1, 3.0, at=11.0), engine(Route.BASE, 0, 2.0, at=11.0), 12.0)
    assert sp.shared(12.0) and sp.shared(71.0)
    assert not sp.shared(72.5)


def test_a_request_the_engine_drops_a_scrape_late_is_not_another_replicas() -> None:
    """A flip moves this replica's streams off spec: the engine aborts them at its next step,
    so the scrape just after still counts some of them. One scrape like that does not make
    the pair shared (which would ask spec for a 15 % premium for a minute); the next scrape,
    without them, clears it."""
    sp = SharedPair()
    sp.record(29.0, engine(Route.SPEC, 60, None, 0), engine(Route.BASE, 0, None, 0), Route.SPEC)
    sp.record(29.5, engine(Route.SPEC, 0, None, 0), engine(Route.BASE, 60, None, 0), Route.BASE)
    late = sp.view(engine(Route.SPEC, 0, 12.0, at=30.0), engine(Route.BASE, 61, 61.0, at=30.0), 30.2)
    assert late.foreign_spec == 12.0 and not sp.shared(30.2)
    sp.view(engine(Route.SPEC, 0, 0.0, at=31.0), engine(Route.BASE, 61, 61.0, at=31.0), 31.2)
    sp.view(engine(Route.SPEC, 0, 5.0, at=32.0), engine(Route.BASE, 61, 61.0, at=32.0), 32.2)
    assert not sp.shared(32.2)  # not two scrapes in a row


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
