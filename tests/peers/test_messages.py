"""The peer channel's wire format: what one replica sends, another reads back exactly;
anything else (too large, not JSON, unknown fields, out of range) is refused."""

from __future__ import annotations

import json

import pytest

from gateway.peers.messages import (
    MAX_MESSAGE_BYTES,
    Bye,
    Counts,
    Regime,
    decode,
    encode,
    features_of,
    learned_of,
    outcome_of,
    witness_of,
)
from gateway.routing.types import Outcome, RequestFeatures, Route


def test_messages_round_trip() -> None:
    f = RequestFeatures("m", temperature=0.7, max_tokens=64, prompt_tokens=300, overlap=0.8, kind="edit")
    w = witness_of("a", "m", f, Route.SPEC, (3.0, 0.0))
    back = decode(encode(w))
    assert back == w
    g = features_of(w)
    assert (g.kind, g.temperature, g.overlap, g.max_tokens, g.prompt_tokens) == ("edit", 0.7, 0.8, 64, 300)
    o = Outcome("m", Route.BASE, "base-0", "chat", 1.0, True, 10, 20, 0.05, 0.006, 0.4, None, None, False, 19)
    msg = learned_of("a", "m", o)
    assert msg is not None and outcome_of(msg) == o  # type: ignore[arg-type]
    for m in (
        Counts(r="a", engines={"spec-0": 2, "base-0": 0}),
        Regime(r="a", model="m", speculating=False, quiet=True),
        Bye(r="a"),
    ):
        assert decode(encode(m)) == m


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"t": "counts", "r": "a"}',  # no engines
        b'{"t": "counts", "r": "a", "engines": {"e": -1}}',  # negative count
        b'{"t": "counts", "r": "a", "engines": {"e": 1}, "x": 1}',  # unknown field
        b'{"t": "regime", "r": "a", "model": "m", "speculating": "yes-please", "quiet": false}',
        b'{"t": "witness", "r": "a", "model": "m", "route": "gpu", "kind": "chat", "temperature": 1,'
        b' "overlap": 0, "loads": [0, 0]}',  # unknown route
        b'{"t": "witness", "r": "a", "model": "m", "route": "spec", "kind": "chat", "temperature": 9,'
        b' "overlap": 0, "loads": [0, 0]}',  # temperature out of range
        b'{"t": "shutdown", "r": "a"}',
        b'{"t": "bye", "r": ""}',
    ],
)
def test_invalid_messages_are_refused(data: bytes) -> None:
    assert decode(data) is None


def test_oversized_messages_are_refused_before_parsing() -> None:
    big = json.dumps(
        {"t": "counts", "r": "a", "engines": {f"e{i}": 1 for i in range(200)}, "pad": "x" * MAX_MESSAGE_BYTES}
    )
    assert decode(big.encode()) is None


def test_an_outcome_out_of_the_wires_range_is_not_sent() -> None:
    o = Outcome("m", Route.SPEC, "spec-0", "chat", 1.0, True, tpot_s=-1.0)
    assert learned_of("a", "m", o) is None


@pytest.mark.parametrize("url", ["http://redis:6379", "unix://relative/redis.sock", "redis"])
def test_a_peer_url_that_redis_cannot_take_is_refused_at_start(url: str) -> None:
    from gateway.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"peers\.url"):
        load_config(None, env={}, overrides={"peers.url": url})
