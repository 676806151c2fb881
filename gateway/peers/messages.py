"""The peer channel's messages: JSON, one per publish, validated on receipt.

A message from another replica is input like a request body: bounded in size, every field
typed and ranged, anything else dropped (and counted) rather than trusted.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gateway.routing.types import Outcome, RequestFeatures, Route

MAX_MESSAGE_BYTES = 16 * 1024
_Name = Annotated[str, Field(min_length=1, max_length=200)]
_Count = Annotated[int, Field(ge=0, le=1_000_000)]
_Seconds = Annotated[float, Field(ge=0.0, le=86_400.0)]
_Load = Annotated[float, Field(ge=0.0, le=1e6)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    r: _Name  # the sending replica's id


class Counts(_Msg):
    """The sender's requests in flight per engine, whole (a later one replaces it)."""

    t: Literal["counts"] = "counts"
    engines: dict[_Name, _Count] = Field(max_length=256)


class Witness(_Msg):
    """A request the sender routed by policy, and the load (spec, plain) it found."""

    t: Literal["witness"] = "witness"
    model: _Name
    route: Route
    kind: Annotated[str, Field(max_length=32)]
    temperature: Annotated[float, Field(ge=0.0, le=2.0)]
    overlap: Annotated[float, Field(ge=0.0, le=1.0)]
    max_tokens: _Count | None = None
    prompt_tokens: _Count = 0
    loads: tuple[_Load, _Load]


class Learned(_Msg):
    """An outcome the sender's policy learned from."""

    t: Literal["outcome"] = "outcome"
    model: _Name
    route: Route
    engine: _Name
    kind: Annotated[str, Field(max_length=32)]
    temperature: Annotated[float, Field(ge=0.0, le=2.0)]
    ok: bool
    prompt_tokens: _Count = 0
    completion_tokens: _Count = 0
    ttft_s: _Seconds | None = None
    tpot_s: _Seconds | None = None
    lookup_acceptance: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    reported_acceptance_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    reported_mean_acceptance_length: Annotated[float, Field(ge=1.0, le=64.0)] | None = None
    probe: bool = False
    steps: _Count | None = None
    predicted_tpot_s: _Seconds | None = None
    extra: dict[Annotated[str, Field(max_length=64)], Annotated[float, Field(ge=-1e6, le=1e6)]] = Field(
        default_factory=dict, max_length=16
    )


class Regime(_Msg):
    """The leader's regime of a model: speculating or not, and whether the pair is quiet."""

    t: Literal["regime"] = "regime"
    model: _Name
    speculating: bool
    quiet: bool


class Bye(_Msg):
    """The sender stops: its counts are gone, its lease (if it held it) released."""

    t: Literal["bye"] = "bye"


Message = Annotated[Counts | Witness | Learned | Regime | Bye, Field(discriminator="t")]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def encode(msg: Counts | Witness | Learned | Regime | Bye) -> bytes:
    return msg.model_dump_json(exclude_defaults=False).encode()


def decode(data: bytes) -> Counts | Witness | Learned | Regime | Bye | None:
    """The message, or None when it is too large, not JSON or not one of ours."""
    if len(data) > MAX_MESSAGE_BYTES:
        return None
    try:
        return _ADAPTER.validate_python(json.loads(data))
    except (ValueError, ValidationError, RecursionError):
        return None


def witness_of(
    replica: str, model: str, f: RequestFeatures, route: Route, loads: tuple[float, float]
) -> Witness:
    return Witness(
        r=replica,
        model=model,
        route=route,
        kind=f.kind[:32],
        temperature=min(2.0, max(0.0, f.temperature)),
        overlap=min(1.0, max(0.0, f.overlap)),
        max_tokens=None if f.max_tokens is None else min(1_000_000, max(0, f.max_tokens)),
        prompt_tokens=min(1_000_000, max(0, f.prompt_tokens)),
        loads=(min(1e6, loads[0]), min(1e6, loads[1])),
    )


def features_of(w: Witness) -> RequestFeatures:
    return RequestFeatures(
        model=w.model,
        temperature=w.temperature,
        max_tokens=w.max_tokens,
        prompt_tokens=w.prompt_tokens,
        overlap=w.overlap,
        kind=w.kind,
    )


# Learned's fields that copy an Outcome's one for one (all but the sender and the tag).
_OUTCOME_FIELDS = tuple(k for k in Learned.model_fields if k not in ("r", "t"))


def learned_of(replica: str, model: str, o: Outcome) -> Learned | None:
    """The outcome as a message (None when a field is out of the wire's range)."""
    fields = {k: getattr(o, k) for k in _OUTCOME_FIELDS}
    fields.update(
        model=model,
        kind=o.kind[:32],
        extra={k[:64]: v for k, v in list(o.extra.items())[:16] if math.isfinite(v)},
    )
    try:
        return Learned(r=replica, **fields)
    except ValidationError:
        return None


def outcome_of(m: Learned) -> Outcome:
    return Outcome(**{k: getattr(m, k) for k in _OUTCOME_FIELDS} | {"extra": dict(m.extra)})
