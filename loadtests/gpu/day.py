"""A compressed day on one pair: the same open-loop arrivals through every policy in turn.

The load follows ``--schedule`` (the schedule grammar of ``specgate simulate``, e.g. a ramp
up past the crossover and back: ``ramp:1-40:50,40:20,ramp:40-1:50``), with Poisson
arrivals and the corpus' requests drawn once (``--seed``) and replayed for every policy.
One gateway (adaptive) fronts the pair; always-spec and always-base are the same gateway
pinned to one engine (``POST /admin/route``), so the adaptive policy never reads requests
it did not send as another replica's. ``direct:<engine>`` replays the day straight to one
engine, no gateway (the Dynamic SD engine). Between policies the engines idle for
``--gap`` seconds, longer than the gateway's scrape window, so no policy's acceptance
window holds the previous one's traffic.

A day run once per policy in a fixed order is confounded by the order: the first slot
is the engines' first saturation since they started, and on an H200 it read 10-15 %
slower than the same routing in a later slot (round 5). ``--prime SECONDS`` sends the
schedule's peak load to each engine for that long first (unmeasured), ``--round K``
rotates the policy order by K, and a policy named twice (``adaptive,...,adaptive``)
runs twice as ``adaptive`` and ``adaptive#2`` (an A/A beside the A/B). Several rounds,
one call each, combine with ``day_rounds.py``.

The report is the scenario report of ``specgate simulate --scenario``: mean and p99 TPOT,
TTFT, goodput, the oracle of the two statics per ``--window`` seconds (the compressed
day's minute), adaptive's capture and time to switch, and the Dynamic SD engine (as
``dynamic-sd``). Outputs under ``--out``: results.{json,csv,md,png}, minutes.csv,
requests.csv, states.jsonl (the gateway's state after each slot, with its stream moves
so far), and what each engine did in each slot (preemptions, queue,
KV-cache use, sampled from its /metrics every second: ``engines-<slot>.jsonl``, summed
up in engines.md and results.json).

Real engines (started by engines.py)::

    python3 loadtests/gpu/day.py --target real --pair eagle3-lo --direct eagle3-dsd --out /tmp/day

Emulated engines configured like the real ones::

    .venv/bin/python loadtests/gpu/day.py --target emulated --pair eagle3-lo --direct eagle3-dsd \\
        --out out/day
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from engine_watch import load as load_watch  # noqa: E402
from engine_watch import summarize, table_md  # noqa: E402
from engines import MODEL, by_name  # noqa: E402
from interleave import save_state, set_pin  # noqa: E402
from sweep import add_target_args, gateway_config, run_main, start_target  # noqa: E402

from specgate_lab.bench.procs import Proc, free_port  # noqa: E402
from specgate_lab.bench.scenario_bench import SocketRecord, send_all  # noqa: E402
from specgate_lab.sim import analysis as an  # noqa: E402
from specgate_lab.sim import scenario_report  # noqa: E402
from specgate_lab.sim.scenarios import from_schedule, scenario_requests  # noqa: E402

PINS = {"adaptive": "auto", "always-spec": "spec", "always-base": "base"}
DYNAMIC_SD = "dynamic-sd"  # the report's name for the direct engine


async def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    policies = slot_order([p for p in args.policies.split(",") if p], args.round)
    bad = sorted({base_name(p) for p in policies} - set(PINS))
    if bad:
        raise SystemExit(f"unknown policies {', '.join(bad)}; choose from {', '.join(PINS)}")
    sc = from_schedule(args.schedule, temperature=args.temperature)
    work = scenario_requests(
        sc.phases, seed=args.seed, mix=None, temperature=args.temperature, max_tokens_cap=args.max_tokens_cap
    )
    spec, base = by_name(args.pair), by_name("base")
    direct = by_name(args.direct) if args.direct else None
    engines = [base, spec, *([direct] if direct else [])]
    target = await start_target(args, engines, str(logdir))
    port = free_port()
    path = logdir / "gateway.yaml"
    cfg = gateway_config(port, spec, base, target.urls, "adaptive", args.profile)
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    gw = Proc(
        "gateway", ["serve", "--config", str(path), "--log-level", "WARNING"], str(logdir / "gateway.log")
    )
    url = f"http://127.0.0.1:{port}"
    recs: dict[str, list[SocketRecord]] = {}
    extra: dict[str, object] = {"ignore_eos": True}  # random weights stop at random: run to max_tokens
    scale = target.time_scale
    try:
        await gw.start()
        await gw.wait_ready(url + "/ready", timeout_s=60)
        await asyncio.sleep(2.5)  # two scrapes: the gateway sees both engines
        if args.prime > 0:
            await prime(url, sc, args, scale, extra)
            await asyncio.sleep(args.gap * scale)
        runs: list[tuple[str, str]] = [(p, base_name(p)) for p in policies]
        if direct is not None:
            runs.append((DYNAMIC_SD, direct.name))
        for i, (name, what) in enumerate(runs):
            if i:
                await asyncio.sleep(args.gap * scale)  # the engines idle: scrape windows empty
            t0 = time.monotonic()
            # vLLM's prefix cache would serve each later policy the prompts the earlier ones
            # prefilled (the same day replayed): every policy gets its own cache salt
            extra["cache_salt"] = f"day-{name}-{args.seed}"
            watched = [direct] if name == DYNAMIC_SD and direct is not None else [spec, base]
            async with target.watching(
                watched, out / f"engines-{name}.jsonl", None if name == DYNAMIC_SD else gw
            ):
                if name == DYNAMIC_SD and direct is not None:
                    e_url = target.urls[direct.name] + "/v1/chat/completions"
                    recs[name] = await send_all(
                        e_url, work, scale, args.drain, model=direct.served, extra=extra
                    )
                else:
                    await set_pin(url, PINS[what])
                    trace = out / f"trace-{name}.jsonl"
                    poll = (
                        asyncio.create_task(trace_state(url, trace, args.trace_every))
                        if what == "adaptive" and name == what
                        else None
                    )
                    try:
                        recs[name] = await send_all(
                            url + "/v1/chat/completions", work, scale, args.drain, extra=extra
                        )
                    finally:
                        if poll is not None:
                            poll.cancel()
                            await asyncio.gather(poll, return_exceptions=True)
                    await save_state(url, str(out / "states.jsonl"), policy=name)
            done = sum(1 for r in recs[name] if r.finished_at is not None)
            print(f"{name:>12}: {done}/{len(work)} finished [{time.monotonic() - t0:.0f} s wall]", flush=True)
    finally:
        await gw.stop()
        await target.stop()
    slo = an.Slo(tpot_ms=args.tpot_slo_ms, ttft_ms=args.ttft_slo_ms)
    report = scenario_report.build(recs, t0=args.warmup, t1=sc.duration_s, slo=slo, window_s=args.window)
    with (out / "requests.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["policy", *SocketRecord.__dataclass_fields__])
        w.writeheader()
        for name, rs in recs.items():
            w.writerows({"policy": name, **asdict(r)} for r in rs)
    meta: dict[str, Any] = {
        "command": "day.py " + " ".join(sys.argv[1:]),
        "target": args.target,
        "pair": args.pair,
        "direct": args.direct,
        "schedule": args.schedule,
        "requests": len(work),
        "seed": args.seed,
        "temperature": args.temperature,
        "max_tokens_cap": args.max_tokens_cap,
        "time_scale": scale,
        "round": args.round,
        "order": policies,
        "prime_s": args.prime,
    }
    # what each engine did in each slot (preemptions, queue, KV use): engine_watch
    meta["engines"] = {name: summarize(load_watch(out / f"engines-{name}.jsonl")) for name in recs}
    (out / "engines.md").write_text(table_md(meta["engines"]), encoding="utf-8")
    title = f"compressed day on {args.pair} ({args.target}): {args.schedule}"
    md = scenario_report.write(report, meta, out, title)
    scenario_report.plot(report, recs.get("adaptive"), sc.phases, out / "results.png", title)
    print(md)
    return 0


def slot_order(policies: list[str], round_: int) -> list[str]:
    """The policies in the order round ``round_`` runs them (rotated by the round), a
    repeated one renamed ``name#2``, ``name#3``... so each slot keeps its own records."""
    seen: dict[str, int] = {}
    named = []
    for p in policies:
        seen[p] = seen.get(p, 0) + 1
        named.append(p if seen[p] == 1 else f"{p}#{seen[p]}")
    k = round_ % len(named) if named else 0
    return named[k:] + named[:k]


def base_name(slot: str) -> str:
    return slot.split("#", 1)[0]


async def prime(url: str, sc: Any, args: argparse.Namespace, scale: float, extra: dict[str, object]) -> None:
    """Unmeasured: the schedule's peak QPS for ``--prime`` seconds to each engine in turn
    (the gateway pinned to it), so that no measured slot is an engine's first saturation."""
    peak = max(ph.peak_qps for ph in sc.phases)
    warm = from_schedule(f"{peak:g}:{args.prime:g}", temperature=args.temperature)
    work = scenario_requests(
        warm.phases,
        seed=args.seed + 1000,
        mix=None,
        temperature=args.temperature,
        max_tokens_cap=args.max_tokens_cap,
    )
    for pin in ("spec", "base"):
        await set_pin(url, pin)
        extra["cache_salt"] = f"prime-{pin}-{args.seed}"
        recs = await send_all(url + "/v1/chat/completions", work, scale, args.drain, extra=extra)
        done = sum(1 for r in recs if r.finished_at is not None)
        print(f"{'prime ' + pin:>12}: {done}/{len(work)} finished (not measured)", flush=True)
    await set_pin(url, "auto")


# What the adaptive policy thought, sampled through the day: enough to tell a wrong model
# (predicted speed-up against the statics' measured ratio) from a slow switch (evidence).
_TRACE_KEYS = (
    "mode",
    "last_predicted_speedup",
    "break_even_tokens_per_step",
    "mix_tokens_per_step",
    "mix_verified_tokens_per_step",
    "live_acceptance_ratio",
    "step_scale",
    "shared_pair",  # other replicas' requests seen on the pair lately (the premium applies)
    "measured_vs_model",
)


async def trace_state(url: str, path: Path, every_s: float) -> None:
    """Append the adaptive policy's state to ``path`` every ``every_s`` seconds until
    cancelled (time, requests in flight, per engine the scraped running/waiting)."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        while True:
            try:
                async with s.get(url + "/admin/state") as r:
                    body = await r.json()
                m = body["models"][MODEL]
                ps = m["policy_state"]
                row: dict[str, Any] = {"t": round(time.monotonic() - t0, 2), "inflight": m["inflight"]}
                row.update({k: ps.get(k) for k in _TRACE_KEYS})
                row["modes"] = ps.get("modes", {}).get("all")
                row["engines"] = {
                    e["route"]: {k: e["stats"].get(k) for k in ("running", "waiting", "step_s")}
                    | {"inflight": e["inflight"]}
                    for pair in m["pairs"]
                    for e in (pair["spec"], pair["base"])
                }
                with path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
            except (aiohttp.ClientError, TimeoutError, KeyError, TypeError, ValueError) as exc:
                with path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"t": round(time.monotonic() - t0, 2), "error": repr(exc)}) + "\n")
            await asyncio.sleep(every_s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_args(p)
    p.add_argument("--pair", default="eagle3-lo", help="the speculative engine paired with the plain one")
    p.add_argument("--direct", default="", help="an engine replaying the day alone (Dynamic SD)")
    p.add_argument("--policies", default="adaptive,always-spec,always-base")
    p.add_argument("--schedule", default="ramp:1-40:50,40:20,ramp:40-1:50", help="QPS schedule")
    p.add_argument("--window", type=float, default=30.0, help="seconds per oracle window (the day's minute)")
    p.add_argument("--warmup", type=float, default=5.0, help="arrivals before this are not reported")
    p.add_argument("--gap", type=float, default=12.0, help="idle seconds between policies")
    p.add_argument(
        "--prime",
        type=float,
        default=0.0,
        help="seconds of the schedule's peak QPS sent to each engine before the measured slots (unmeasured)",
    )
    p.add_argument("--round", type=int, default=0, help="rotate the policy order by this many slots")
    p.add_argument(
        "--trace-every",
        type=float,
        default=1.0,
        help="seconds between samples of adaptive's state (trace-*.jsonl)",
    )
    p.add_argument("--drain", type=float, default=60.0, help="seconds to finish after the last arrival")
    p.add_argument("--tpot-slo-ms", type=float, default=50.0)
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run)


if __name__ == "__main__":
    raise SystemExit(main())
