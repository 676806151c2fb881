"""A stream moved between two engines mid-answer: what vLLM makes of the continuation.

For each direction (spec → base, base → spec) and endpoint (chat, completions), one T=0
answer of ``--tokens`` tokens (``ignore_eos``) streams through ``specgate serve`` pinned to
the source engine, twice: once untouched (the reference), once with
``POST /admin/drain {"engine": source, "move": true}`` after ``--after`` content chunks
(then the engine is undrained). Per case: whether it moved (the gateway's
``specgate_stream_moves_total``), the source engine's aborts, the text against the
reference (greedy decoding continues its own text where the tokenizer round-trips it),
usage, and the client-side gap at the move (the longest pause between two content
chunks, against the median).

Real engines (started by engines.py)::

    python3 loadtests/gpu/move_check.py --target real --pair ngram --out /tmp/move

Emulated engines configured like the real ones::

    .venv/bin/python loadtests/gpu/move_check.py --target emulated --pair ngram --out out/move
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import aiohttp
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from engines import MODEL, by_name  # noqa: E402
from sweep import add_target_args, gateway_config, run_main, start_target  # noqa: E402

from gateway.wire.sse import EventDecoder, json_payloads  # noqa: E402
from specgate_lab.bench.procs import Proc, free_port  # noqa: E402
from specgate_lab.workload import sample, to_openai_body  # noqa: E402

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def body_for(endpoint: str, tokens: int, seed: int) -> dict[str, Any]:
    """A copy-heavy corpus request (an edit) at T=0 with exactly ``tokens`` answer tokens."""
    req = sample(random.Random(seed), "edit=1", 0.0)
    chat = to_openai_body(req, MODEL, stream=True)
    chat.update(temperature=0, max_tokens=tokens, ignore_eos=True)
    if endpoint == "chat":
        return chat
    prompt = "\n\n".join(str(m["content"]) for m in chat["messages"]) + "\n\n"
    return {
        "model": MODEL,
        "prompt": prompt,
        "temperature": 0,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_once(
    s: aiohttp.ClientSession, gw: str, endpoint: str, body: dict[str, Any], move: str | None, after: int
) -> dict[str, Any]:
    """One streamed answer; with ``move`` (an engine name), drain that engine with move
    after ``after`` content chunks."""
    text, ids, roles, usage, gaps = [], set(), 0, None, []
    last = None
    moved_at = None
    n = 0
    async with s.post(gw + PATHS[endpoint], json=body) as r:
        assert r.status == 200, await r.text()
        route = r.headers.get("x-specgate-route")
        decoder = EventDecoder()
        async for data in r.content.iter_any():
            for obj in json_payloads(decoder.feed(data)):
                ids.add(obj.get("id"))
                if obj.get("usage"):
                    usage = obj["usage"]
                for c in obj.get("choices") or ():
                    delta = c.get("delta") or {}
                    roles += "role" in delta
                    piece = delta.get("content") if "delta" in c else c.get("text")
                    if piece:
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(now - last)
                        last = now
                        text.append(piece)
                        n += 1
                        if move is not None and n == after and moved_at is None:
                            moved_at = len(gaps)
                            async with s.post(gw + "/admin/drain", json={"engine": move, "move": True}) as d:
                                asked = await d.json()
                            async with s.post(gw + "/admin/drain", json={"engine": move, "draining": False}):
                                pass
                            assert asked.get("moving") == 1, asked
    return {
        "route": route,
        "text": "".join(text),
        "ids": len(ids),
        "roles": roles,
        "usage": usage,
        "chunks": n,
        "gap_at_move_ms": None if moved_at is None else round(1000 * max(gaps[moved_at : moved_at + 3]), 2),
        "median_gap_ms": round(1000 * statistics.median(gaps), 2) if gaps else None,
    }


async def metric(s: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    async with s.get(url + "/metrics") as r:
        page = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())
    )


async def aborts(s: aiohttp.ClientSession, url: str) -> float:
    return await metric(s, url, "vllm:request_success_total", finished_reason="abort")


async def check(args: argparse.Namespace) -> int:
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    spec, base = by_name(args.pair), by_name("base")
    target = await start_target(args, [base, spec], os.path.join(args.out, "logs"))
    port = free_port()
    path = os.path.join(args.out, "logs", "gateway.yaml")
    with open(path, "w", encoding="utf-8") as fh:  # noqa: ASYNC230 - tiny local file
        yaml.safe_dump(gateway_config(port, spec, base, target.urls, "adaptive", args.profile), fh)
    gw = Proc(
        "gateway",
        ["serve", "--config", path, "--log-level", "WARNING"],
        os.path.join(args.out, "logs", "gw.log"),
    )
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        await gw.start()
        await gw.wait_ready(url + "/ready", timeout_s=60)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
            for source, dest in ((spec, base), (base, spec)):
                async with s.post(
                    url + "/admin/route", json={"model": MODEL, "route": "spec" if source.spec else "base"}
                ):
                    pass
                for endpoint in ("chat", "completions"):
                    body = body_for(endpoint, args.tokens, args.seed)
                    ref = await stream_once(s, url, endpoint, body, None, 0)
                    aborts0 = await aborts(s, target.urls[source.name])
                    moved = await stream_once(s, url, endpoint, body, source.name, args.after)
                    aborts1 = await aborts(s, target.urls[source.name])
                    common_text = os.path.commonprefix([ref["text"], moved["text"]])  # noqa: RUF071 - a common prefix of texts
                    row = {
                        "from": source.name,
                        "to": dest.name,
                        "endpoint": endpoint,
                        "same_text": moved["text"] == ref["text"],
                        "common_prefix_chars": len(common_text),
                        "ref_chars": len(ref["text"]),
                        "moved_chars": len(moved["text"]),
                        "ids": moved["ids"],
                        "role_chunks": moved["roles"],
                        "usage_ref": ref["usage"],
                        "usage_moved": moved["usage"],
                        "source_aborts": aborts1 - aborts0,
                        "gap_at_move_ms": moved["gap_at_move_ms"],
                        "median_gap_ms": moved["median_gap_ms"],
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            moves = await metric(s, url, "specgate_stream_moves_total", result="moved")
            print(json.dumps({"gateway_moves": moves}), flush=True)
    finally:
        await gw.stop()
        await target.stop()
    with open(os.path.join(args.out, "move_check.json"), "w", encoding="utf-8") as fh:  # noqa: ASYNC230
        json.dump(rows, fh, indent=1)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="ngram", help="the speculative engine of the pair")
    p.add_argument("--tokens", type=int, default=400, help="answer tokens (ignore_eos)")
    p.add_argument("--after", type=int, default=40, help="content chunks before the move")
    add_target_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), check)


if __name__ == "__main__":
    raise SystemExit(main())
