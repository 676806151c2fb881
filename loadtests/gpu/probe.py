"""Contract probe of real vLLM engines: what the gateway relies on, recorded as data.

For each engine: ``GET /v1/models``, one non-streaming and one streaming completion at
temperature 0 (raw SSE kept), the ``/metrics`` page; on speculative engines also the
parameters a speculative engine refuses (``min_p``, ``logit_bias``) streaming and not.

    python3 loadtests/gpu/probe.py OUTDIR [engine,...]
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engines import ENGINES, by_name

PROMPT = (
    "Rename the function `load` to `read` everywhere in this file. Return the complete file.\n"
    "def load(path):\n    return open(path).read()\n\nprint(load('a.txt'))\n"
)


def call(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return {
                "status": r.status,
                "headers": dict(r.headers),
                "body": r.read().decode("utf-8", "replace"),
            }
    except urllib.error.HTTPError as exc:
        return {
            "status": exc.code,
            "headers": dict(exc.headers),
            "body": exc.read().decode("utf-8", "replace"),
        }
    except OSError as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def probe(name: str) -> dict[str, Any]:
    e = by_name(name)
    base = {"model": e.served, "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    out: dict[str, Any] = {"engine": name, "served": e.served, "spec": e.spec}
    out["models"] = call("GET", e.url + "/v1/models")
    out["completion"] = call("POST", e.url + "/v1/completions", base)
    out["completion_t1"] = call("POST", e.url + "/v1/completions", {**base, "temperature": 1.0})
    out["stream"] = call(
        "POST", e.url + "/v1/completions", {**base, "stream": True, "stream_options": {"include_usage": True}}
    )
    chat = {
        "model": e.served,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    out["chat_stream"] = call("POST", e.url + "/v1/chat/completions", chat)
    if e.spec is not None:
        for key, val in (("min_p", 0.1), ("logit_bias", {"5": 1.0})):
            out[f"refused_{key}"] = call("POST", e.url + "/v1/completions", {**base, key: val})
            out[f"refused_{key}_stream"] = call(
                "POST", e.url + "/v1/completions", {**base, key: val, "stream": True}
            )
    out["metrics"] = call("GET", e.url + "/metrics")
    return out


def main(argv: list[str]) -> int:
    outdir = argv[1] if len(argv) > 1 else "."
    names = argv[2].split(",") if len(argv) > 2 else [e.name for e in ENGINES]
    os.makedirs(outdir, exist_ok=True)
    res = {n: probe(n) for n in names}
    for n, r in res.items():
        page = r.pop("metrics")
        with open(os.path.join(outdir, f"metrics-{n}-probe.txt"), "w", encoding="utf-8") as fh:
            fh.write(page.get("body", ""))
        print(
            n,
            {k: v.get("status") for k, v in r.items() if isinstance(v, dict) and "status" in v},
            (r["completion"].get("body") or "")[:300],
            flush=True,
        )
    with open(os.path.join(outdir, "probe.json"), "w", encoding="utf-8") as fh:
        json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
