"""The upstream request body, spliced from the client's bytes instead of re-serialised.

The gateway parses every request body once (to validate it and route it); the body it
forwards differs from the client's only in ``model`` (and, for a stream, an added
``stream_options.include_usage``). Re-serialising the whole object costs time in
proportion to the prompt; splicing the few changed bytes does not. The splice is done
only when the bytes prove it is exact; otherwise the caller serialises the parsed object.
"""

from __future__ import annotations

import functools
import json
import re

# The key "model" with a string value (matched where the one '"model"' of the body starts).
_MODEL_KEY = re.compile(rb'"model"\s*:\s*("(?:[^"\\]|\\.)*")')
_USAGE = b'"stream_options":{"include_usage":true}'


@functools.lru_cache(maxsize=256)  # model names come from the configuration
def _encoded(name: str) -> bytes:
    return json.dumps(name, ensure_ascii=False).encode()


def splice_model(raw: bytes, client: str, served: str, *, add_usage: bool) -> bytes | None:
    """``raw`` with its top-level ``model`` (``client``) renamed to ``served`` and, with
    ``add_usage``, ``"stream_options":{"include_usage":true}`` added; None when the bytes
    do not prove the splice exact (the caller then serialises the parsed body).

    Exact because: a JSON string cannot contain the bytes ``"model"`` unless it ends with
    an escaped quote (then the count below is 2, or the key is not after ``{``/``,``); with
    no ``\\u006x`` escape the top-level key is spelled literally, so when ``"model"`` occurs
    once it is that key; a BOM or UTF-16/32 body never matches.
    """
    if raw.count(b'"model"') != 1 or b"\\u006" in raw or raw[:64].lstrip()[:1] != b"{":
        return None
    at = raw.find(b'"model"')
    if raw[max(0, at - 64) : at].rstrip()[-1:] not in (b"{", b","):  # in key position, so not inside a string
        return None
    m = _MODEL_KEY.match(raw, at)
    if m is None:
        return None
    value = m.group(1)
    if value != _encoded(client):  # the usual spelling; any other must decode to the name
        try:
            if json.loads(value) != client:
                return None
        except ValueError:
            return None
    out = raw[: m.start(1)] + _encoded(served) + raw[m.end(1) :]
    if add_usage:
        if b'"stream_options"' in raw:
            return None
        out = out.rstrip()
        if not out.endswith(b"}"):
            return None
        out = out[:-1].rstrip()
        out = out[:-1] + b"{" + _USAGE + b"}" if out.endswith(b"{") else out + b"," + _USAGE + b"}"
    return out
