"""Hostile HTTP requests for the gateway, as hypothesis strategies, and the property they must meet.

Shared by the CI fuzz tests (tests/fuzz) and the benchmark run (loadtests/fuzz_bench.py).
Requests are sent with the standard library's ``http.client`` from a worker thread (so
any byte string can be sent as a body and any latin-1 text as a header value) to a
gateway serving on loopback.

The property (:func:`check`): never a 5xx, never a traceback or Python internals in the
body; every 4xx is an OpenAI-shaped error; a 200 is a complete answer (a JSON body, or
an event stream ending in ``data: [DONE]``); the ``x-request-id`` echoed back is always
sanitised.
"""

from __future__ import annotations

import http.client
import json
import re
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

PATHS = ("/v1/chat/completions", "/v1/completions")
SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
LEAKS = (b"Traceback", b'File "', b"site-packages", b"Exception:", b"Error(")


@dataclass
class Case:
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"

    def __repr__(self) -> str:  # short, for hypothesis' falsifying example
        return f"Case({self.method} {self.path}, body={self.body[:300]!r}..., headers={self.headers!r})"


# -- JSON values ----------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)

# Plausible values for the fields the gateway reads: edges, wrong types, NaN, negatives.
_numbers = st.sampled_from([0, 1, -1, 2, 0.5, -0.0, 1e-9, 1e9, 1 << 31, 1 << 64, -(1 << 63), 3.7])
_field_values = _numbers | st.floats(allow_nan=True, allow_infinity=True) | json_values
_small_tokens = st.integers(min_value=1, max_value=24)

FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "stop",
    "logit_bias",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "messages",
    "prompt",
    "model",
    "user",
    "tools",
    "response_format",
)

_content = st.text(max_size=200) | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "x"]), "text": _field_values}),
    max_size=3,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", ""]) | json_values, "content": _content}
)


@st.composite
def _valid_base(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m1", "max_tokens": draw(_small_tokens)}
    if chat:
        body["messages"] = draw(st.lists(_message, min_size=1, max_size=3))
    else:
        body["prompt"] = draw(st.text(max_size=200) | st.lists(st.integers(0, 1000), min_size=1, max_size=20))
    if draw(st.booleans()):
        body["stream"] = True
    if draw(st.booleans()):
        body["temperature"] = draw(st.floats(0, 2))
    return body


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Case:
    """A well-formed request with a few fields replaced by hostile values."""
    chat = draw(st.booleans())
    body = draw(_valid_base(chat))
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        if key in ("max_tokens", "max_completion_tokens", "n") and draw(st.booleans()):
            body[key] = draw(st.integers(-5, 30))  # keep most accepted requests short
        else:
            body[key] = draw(_field_values)
    if body.get("n") not in (None, 1) and isinstance(body.get("n"), int):
        body["max_tokens"] = draw(_small_tokens)
    raw = json.dumps(body, allow_nan=True).encode()
    return Case(PATHS[0] if chat else PATHS[1], raw)


@st.composite
def valid_bodies(draw: st.DrawFn) -> Case:
    """Requests the gateway must accept and forward, with hostile-but-legal content."""
    chat = draw(st.booleans())
    body = draw(_valid_base(chat))
    if chat:
        body["messages"] = draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "system", "assistant"]),
                        "content": st.text(max_size=400) | st.just("```\n" + "x = 1\n" * 200 + "```"),
                    }
                ),
                min_size=1,
                max_size=4,
            )
        )
    extras = {
        "stop": st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1, max_size=5), max_size=3),
        "logit_bias": st.dictionaries(st.integers(0, 100).map(str), st.floats(-100, 100), max_size=3),
        "min_p": st.floats(0, 1),
        "seed": st.integers(0, 1 << 32),
        "top_p": st.floats(0.01, 1),
        "user": st.text(max_size=50),
        "x_unknown_field": json_values,
    }
    for key in draw(st.lists(st.sampled_from(sorted(extras)), max_size=3, unique=True)):
        body[key] = draw(extras[key])
    if body.get("stream") and draw(st.booleans()):
        body["stream_options"] = {"include_usage": draw(st.booleans())}
    return Case(PATHS[0] if chat else PATHS[1], json.dumps(body).encode())


@st.composite
def random_json_bodies(draw: st.DrawFn) -> Case:
    return Case(draw(st.sampled_from(PATHS)), json.dumps(draw(json_values), allow_nan=True).encode())


@st.composite
def raw_bodies(draw: st.DrawFn) -> Case:
    """Bytes: random, truncated JSON, invalid UTF-8, deep nesting, big numbers, surrogates."""
    good = b'{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":4}'
    kind = draw(st.sampled_from(["random", "truncated", "utf8", "nested", "number", "surrogate", "dupkeys"]))
    if kind == "random":
        raw = draw(st.binary(max_size=300))
    elif kind == "truncated":
        raw = good[: draw(st.integers(0, len(good) - 1))]
    elif kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]))
        raw = good.replace(b"hi", b"h" + bad)
    elif kind == "nested":
        d = draw(st.integers(10, 200_000))
        o, c = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        raw = good[:-1] + b',"x":' + o * d + b"1" + c * d + b"}"
    elif kind == "number":
        num = draw(st.sampled_from([b"1e400", b"-1e400", b"9" * 5000, b"NaN", b"Infinity", b"-0", b"1e-400"]))
        field_ = draw(st.sampled_from([b"temperature", b"max_tokens", b"top_p", b"seed", b"other"]))
        raw = good[:-1] + b',"' + field_ + b'":' + num + b"}"
    elif kind == "surrogate":
        esc = draw(
            st.sampled_from([b"\\ud800", b"\\udfff", b"\\ud83d\\ude00", b"\\u0000", b"\\ud800\\u0041"])
        )
        raw = good.replace(b"hi", esc)
    else:
        raw = good[:-1] + b',"model":"other","model":"m1"}'
    return Case(draw(st.sampled_from(PATHS)), raw)


_header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"), max_size=200
)


@st.composite
def hostile_headers(draw: st.DrawFn) -> dict[str, str]:
    h: dict[str, str] = {}
    for name in draw(
        st.lists(
            st.sampled_from(
                [
                    "x-request-id",
                    "x-specgate-route",
                    "authorization",
                    "content-type",
                    "traceparent",
                    "tracestate",
                    "x-forwarded-for",
                    "accept",
                    "x-specgate-engine",
                    "connection",
                ]
            ),
            max_size=4,
            unique=True,
        )
    ):
        h[name] = draw(
            _header_text | st.sampled_from(["spec", "base", "auto", "SPEC ", "close", "keep-alive"])
        )
    return h


_rarely = st.sampled_from([False] * 19 + [True])


@st.composite
def cases(draw: st.DrawFn) -> Case:
    case = draw(valid_bodies() | mutated_bodies() | random_json_bodies() | raw_bodies())
    case.headers = draw(hostile_headers())
    if draw(_rarely):  # now and then: a wrong method or an unknown path
        case.method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
    if draw(_rarely):
        case.path = draw(
            st.sampled_from(["/v1/chat/completions/", "/v1/../admin/state", "/v1/models", "/%ff"])
        )
    return case


# -- sending and checking ---------------------------------------------------------------


def send(host: str, port: int, case: Case, timeout: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.putrequest(case.method, case.path, skip_accept_encoding=True)
        names = {k.lower() for k in case.headers}
        if "content-type" not in names:
            conn.putheader("Content-Type", "application/json")
        for k, v in case.headers.items():
            if k.lower() == "connection":
                continue  # http.client owns the connection
            conn.putheader(k, v.encode("latin-1"))
        conn.putheader("Content-Length", str(len(case.body)))
        conn.endheaders(case.body)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def check(case: Case, status: int, headers: dict[str, str], body: bytes) -> None:
    """The property every answer to a hostile request must meet (raises AssertionError)."""
    assert status < 500, f"{status} for {case!r}: {body[:300]!r}"
    for leak in LEAKS:
        assert leak not in body, f"{leak!r} leaked for {case!r}: {body[:300]!r}"
    rid = headers.get("x-request-id")
    if (case.method == "POST" and case.path in PATHS) or status >= 400:
        assert rid is not None, "no x-request-id"
    assert rid is None or SAFE_REQUEST_ID.fullmatch(rid), f"unsafe request id {rid!r}"
    if status >= 400:
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and err["message"], err
    elif status == 200 and case.method == "POST":
        if headers.get("content-type", "").startswith("text/event-stream"):
            assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
        else:
            assert isinstance(json.loads(body), dict)
