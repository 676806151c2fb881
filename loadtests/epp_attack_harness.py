#!/usr/bin/env python3
"""The harness of ``epp_attack.py run``: each attack against a live gateway, with chat load.

For each attack (and ``none`` first, the baseline) it starts a fresh emulated pair and
``python -m gateway serve`` with the Endpoint Picker on (``epp.enabled``), waits for the
engines to be healthy, then for ``--duration`` seconds at once:

- 5 chat requests per second (``--qps``) on the gateway's HTTP port (latency, status);
- ``GET /health`` every 50 ms (latency: the event loop's responsiveness);
- the gateway's RSS every 250 ms (psutil);
- ``GET /admin/state`` every 500 ms: whether any engine is marked down;
- the attack, from a separate process (``epp_attack.py attack``) on the EPP port.

It prints a table and writes the whole record as JSON (``--out``). The machine it runs on is
reported (CPU count): on few shared cores the attacker, the engines and the gateway compete.

    python loadtests/epp_attack.py run --attacks all --duration 10 --connections 1 \\
        --out loadtests/results/epp-attack-before.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from specgate_lab.bench.procs import emulated_pair_model, free_port, process_cpu_s, start_serve  # noqa: E402
from specgate_lab.emulator.launch import pair_launches, start_group  # noqa: E402

MODEL = "qwen3-8b"
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say hello in five words."}],
    "max_tokens": 16,
}


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _chat(
    s: aiohttp.ClientSession, url: str, qps: float, stop: float, out: list[tuple[float, int]]
) -> None:
    async def one() -> None:
        t = time.monotonic()
        try:
            async with s.post(
                url + "/v1/chat/completions", json=CHAT, timeout=aiohttp.ClientTimeout(30)
            ) as r:
                await r.read()
                out.append((time.monotonic() - t, r.status))
        except Exception:
            out.append((time.monotonic() - t, 0))

    tasks = []
    start = time.monotonic()
    i = 0
    while (due := start + i / qps) < stop:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tasks.append(asyncio.ensure_future(one()))
        i += 1
    await asyncio.gather(*tasks)


async def _health(s: aiohttp.ClientSession, url: str, stop: float, out: list[float]) -> None:
    while time.monotonic() < stop:
        t = time.monotonic()
        try:
            async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(30)) as r:
                await r.read()
        except Exception:
            pass
        out.append(time.monotonic() - t)
        await asyncio.sleep(0.05)


async def _engines(s: aiohttp.ClientSession, url: str, stop: float, down: set[str]) -> None:
    while time.monotonic() < stop:
        try:
            async with s.get(url + "/admin/state", timeout=aiohttp.ClientTimeout(30)) as r:
                st = await r.json()
            for mdl in st["models"].values():
                for pair in mdl["pairs"]:
                    for e in (pair["spec"], pair["base"]):
                        if not e["healthy"]:
                            down.add(e["name"])
        except Exception:
            pass
        await asyncio.sleep(0.5)


async def _rss(pid: int, stop: float, out: list[float]) -> None:
    p = psutil.Process(pid)
    while time.monotonic() < stop:
        try:
            out.append(p.memory_info().rss / 1e6)
        except psutil.Error:
            return
        await asyncio.sleep(0.25)


async def one_run(attack: str, a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    group = await start_group(
        pair_launches(port_spec=0, port_base=0, name_spec=MODEL, name_base=MODEL), time_scale=a.time_scale
    )
    spec_url, base_url = group.urls
    epp_port = free_port()
    cfg = {
        "server": {"host": "127.0.0.1", "port": 0, "max_concurrency": 512},
        "scrape": {"interval_s": 1.0, "timeout_s": 0.5, "stale_after_s": 5.0},
        "epp": {"enabled": True, "host": "127.0.0.1", "port": epp_port, **a.epp_config},
        "models": [emulated_pair_model(spec_url, base_url, spec_served=MODEL, base_served=MODEL, name=MODEL)],
    }
    cfg_path = tmp / f"gateway-{attack}.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    log_path = tmp / f"gateway-{attack}.log"
    proc, url = await start_serve(cfg_path, log_level="WARNING", cwd=REPO)
    log_fh = open(log_path, "wb")  # noqa: SIM115, ASYNC230 - a local file, closed below

    async def pump() -> None:
        assert proc.stderr is not None
        while chunk := await proc.stderr.read(65536):
            log_fh.write(chunk)

    pumping = asyncio.ensure_future(pump())
    chats: list[tuple[float, int]] = []
    health: list[float] = []
    rss: list[float] = []
    down: set[str] = set()
    attack_res: dict[str, Any] | None = None
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(100):  # the engines healthy, the gateway warm
                async with s.get(url + "/ready") as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.1)
            for _ in range(5):
                async with s.post(url + "/v1/chat/completions", json=CHAT) as r:
                    await r.read()
            rss0 = psutil.Process(proc.pid).memory_info().rss / 1e6
            cpu0 = process_cpu_s(proc.pid) or 0.0
            stop = time.monotonic() + a.duration
            jobs = [
                _chat(s, url, a.qps, stop, chats),
                _health(s, url, stop, health),
                _engines(s, url, stop + 1.0, down),
                _rss(proc.pid, stop + 1.0, rss),
            ]
            attacker = None
            out_json = tmp / f"attack-{attack}.json"
            if attack != "none":
                attacker = await asyncio.create_subprocess_exec(
                    sys.executable, str(HERE / "epp_attack.py"), "attack",
                    "--target", f"127.0.0.1:{epp_port}",
                    "--attack", attack, "--duration", str(a.duration), "--connections", str(a.connections),
                    "--body-mb", str(a.body_mb), "--out", str(out_json), cwd=REPO,
                )  # fmt: skip
            await asyncio.gather(*jobs)
            cpu_share = ((process_cpu_s(proc.pid) or 0.0) - cpu0) / (a.duration + 1.0)
            if attacker is not None:
                await asyncio.wait_for(attacker.wait(), 30)
                attack_res = json.loads(out_json.read_text())
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        await pumping
        log_fh.close()
        await group.stop()
    lat = [t for t, st in chats if st == 200]
    closes = []
    if attack_res is not None:
        closes = [c["closed_at"] for c in attack_res["conns"] if c["closed_at"] is not None]
    return {
        "attack": attack,
        "connections": a.connections if attack != "none" else 0,
        "chat_sent": len(chats),
        "chat_failed": sum(1 for _, st in chats if st != 200),
        "chat_p50_ms": 1e3 * (_pct(lat, 0.5) or 0),
        "chat_p99_ms": 1e3 * (_pct(lat, 0.99) or 0),
        "health_p50_ms": 1e3 * (_pct(health, 0.5) or 0),
        "health_p99_ms": 1e3 * (_pct(health, 0.99) or 0),
        "health_max_ms": 1e3 * max(health or [0]),
        "engines_down": sorted(down),
        "gateway_cpu_share": cpu_share,  # of one core, over the attack (and a second after)
        "rss_before_mb": rss0,
        "rss_peak_mb": max(rss or [rss0]),
        "first_close_s": min(closes) if closes else None,
        "closes": len(closes),
        "goaway_codes": sorted(
            {c["goaway"] for c in (attack_res or {}).get("conns", []) if c["goaway"] is not None}
        ),
        "rst_received": _rst_codes(attack_res),
        "attacker": {k: v for k, v in (attack_res or {}).items() if k != "conns"},
        "attacker_conns": (attack_res or {}).get("conns", [])[:50],
        "gateway_log_tail": log_path.read_text(errors="replace").splitlines()[-5:],
    }


async def epp_attacks(
    port: int, names: list[str], each_s: float, connections: int, stop: asyncio.Event
) -> list[Any]:
    """``--epp-attack``: the EPP attack suite (``epp_attack.py``, its own process) against the
    gateway's EPP port, one attack after another for ``each_s`` seconds each, round after
    round until the load ends. What each round's attacker saw is returned (the connections
    the gateway closed, and when)."""
    out: list[Any] = []
    i = 0
    while not stop.is_set():
        name = names[i % len(names)]
        i += 1
        fd, path = tempfile.mkstemp(prefix="epp-attack-", suffix=".json")
        os.close(fd)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(HERE / "epp_attack.py"), "attack",
            "--target", f"127.0.0.1:{port}", "--attack", name, "--duration", str(each_s),
            "--connections", str(connections), "--out", path,
        )  # fmt: skip
        await proc.wait()
        try:
            with open(path, "rb") as fh:  # noqa: ASYNC230 - a small local file
                r = json.loads(fh.read())
            closes = [c["closed_at"] for c in r["conns"] if c["closed_at"] is not None]
            out.append(
                {
                    "attack": name,
                    "frames": r["frames"],
                    "closes": len(closes),
                    "first_close_s": min(closes, default=None),
                }
            )
        except (OSError, ValueError, KeyError):
            out.append({"attack": name, "error": "no result"})
        os.unlink(path)
    return out


def _rst_codes(res: dict[str, Any] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in (res or {}).get("conns", []):
        for code, n in c["rst_codes"].items():
            out[code] = out.get(code, 0) + n
    return out


# Attacks whose connection must be ended (a frame budget or flow control crossed); the others
# are answered at the stream level (RST_STREAM) and may keep their connection.
CLOSING = {
    "rapid_reset", "continuation", "ping_flood", "settings_flood", "streams_settings", "streams_window",
    "partial_messages",
}  # fmt: skip


def missed(r: dict[str, Any], base: dict[str, Any] | None) -> list[str]:
    """The issue's targets this row misses (against the no-attack row ``base``)."""
    out = []
    if r["chat_failed"]:
        out.append("failed chat")
    if base is not None and r is not base and r["chat_p99_ms"] > 1.2 * base["chat_p99_ms"]:
        out.append("chat p99 > 1.2x")
    if r["health_p99_ms"] > 100:
        out.append("/health p99 > 100 ms")
    if r["engines_down"]:
        out.append("engine down")
    if r["rss_peak_mb"] > r["rss_before_mb"] + 100:
        out.append("RSS > +100 MB")
    if r["attack"] in CLOSING and (r["first_close_s"] is None or r["first_close_s"] > 1.0):
        out.append("not closed within 1 s")
    return out


def _share(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| attack | conns | chat fail/sent | chat p50 / p99 ms | /health p50 / p99 / max ms | gateway CPU "
        "| engines down "
        "| RSS before → peak MB | first close s (GOAWAY) | closes | RST_STREAM got | frames sent/s "
        "| targets missed |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        close = "-" if r["first_close_s"] is None else f"{r['first_close_s']:.2f} ({r['goaway_codes']})"
        fps = r["attacker"].get("frames_per_s", 0)
        lines.append(
            f"| {r['attack']} | {r['connections']} | {r['chat_failed']}/{r['chat_sent']} "
            f"| {r['chat_p50_ms']:.0f} / {r['chat_p99_ms']:.0f} "
            f"| {r['health_p50_ms']:.0f} / {r['health_p99_ms']:.0f} / {r['health_max_ms']:.0f} "
            f"| {_share(r.get('gateway_cpu_share'))} | {','.join(r['engines_down']) or '-'} "
            f"| {r['rss_before_mb']:.0f} → {r['rss_peak_mb']:.0f} "
            f"| {close} | {r['closes']} | {r['rst_received'] or '-'} | {fps:,.0f} "
            f"| {', '.join(r.get('missed', [])) or '-'} |"
        )
    return "\n".join(lines)


async def harness(a: argparse.Namespace) -> dict[str, Any]:
    from epp_attack import ATTACKS

    names = list(ATTACKS) if a.attacks == "all" else a.attacks.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="specgate-epp-attack-"))
    rows = []
    for name in ["none", *names] if a.baseline else names:
        row = await one_run(name, a, tmp)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    base = next((r for r in rows if r["attack"] == "none"), None)
    for r in rows:
        r["missed"] = missed(r, base)
    return {
        "command": " ".join(["python", "loadtests/epp_attack.py", "run", *sys.argv[2:]]),
        "host": {"cpus": os.cpu_count(), "note": a.note},
        "duration_s": a.duration,
        "qps": a.qps,
        "rows": rows,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attacks", default="all", help="comma list of attacks, or all")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per attack (default 15)")
    p.add_argument("--connections", type=int, default=1, help="attacking connections (default 1)")
    p.add_argument("--qps", type=float, default=5.0, help="chat requests per second (default 5)")
    p.add_argument("--body-mb", type=int, default=800, help="zero_window: body size in MB")
    p.add_argument("--time-scale", type=float, default=0.05, help="the emulator's clock (default 0.05)")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the no-attack run")
    p.add_argument(
        "--epp",
        action="append",
        default=[],
        help="KEY=VALUE under epp (YAML value; KEY may be dotted: limits.slice_ms)",
    )
    p.add_argument("--note", default="", help="a note on the machine, stored with the results")
    p.add_argument("--out", default=None, help="write the JSON record here")
    a = p.parse_args(argv)
    a.epp_config = {}
    for key, _, value in (e.partition("=") for e in a.epp):
        *path, leaf = key.split(".")
        node = a.epp_config
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    res = asyncio.run(harness(a))
    print(table(res["rows"]))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return 0
