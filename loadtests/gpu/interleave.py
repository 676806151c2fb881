"""Routing policies compared in interleaved windows on the same warm engines.

One gateway in front of the (spec, plain) pair. For each concurrency C and each round,
every *slot* in turn keeps C streaming requests in flight through it for ``--warmup +
--measure`` seconds and lets them finish before the next slot starts. A static slot
(always-spec, always-base) pins the model to its engine for its window (``POST
/admin/route``: the hard rules still apply, exactly as the static policies route); an
adaptive slot unpins it. So every request on the engines is the gateway's own: separate
gateways per policy would read each other's requests in the scrapes as other replicas'
(a shared pair, :mod:`gateway.routing.adaptive.shared`), and the spec engine's windowed
acceptance as their own. ``--gateways per-policy`` runs one gateway per policy instead
(for comparing two non-static policies; keep their windows apart).

The default slots are ``adaptive, always-spec, always-base, adaptive``: the repeated
policy is the A/A comparison, so the noise between windows is shown beside every A/B.
Every slot of a round sends the same request sequence. A slot ``direct:<engine>`` sends
it straight to that engine, no gateway (one engine with vLLM's Dynamic SD, say).

Figures are per window (mean and p99 TPOT, overall and per temperature class); policies
are compared round by round with bootstrap intervals over rounds
(:mod:`specgate_lab.bench.windows`). Outputs under ``--out``: windows.csv, requests.csv,
report.json, report.md, states.jsonl (the gateway's ``/admin/state`` after each window), and
engines/ (each engine's /metrics every second of each window, :mod:`engine_watch`; windows.csv
carries the window's preemptions, longest queue and fullest KV cache). ``--min-requests N``
closes a window once N requests started in it (``--measure`` is then the most it lasts).

Real engines (started by engines.py)::

    python3 loadtests/gpu/interleave.py --target real --pair ngram --out /tmp/il

Emulated engines configured like the real ones::

    .venv/bin/python loadtests/gpu/interleave.py --target emulated --time-scale 4 --out out/il
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from engine_watch import load as load_watch  # noqa: E402
from engine_watch import summarize  # noqa: E402
from engines import MODEL, by_name  # noqa: E402
from sweep import add_load_args, closed_loop, gateway_config, run_main, start_target  # noqa: E402

from gateway.routing.factory import POLICY_NAMES  # noqa: E402
from specgate_lab.bench.procs import Proc, free_port  # noqa: E402
from specgate_lab.bench.stats import CSV_FIELDS  # noqa: E402
from specgate_lab.bench.windows import compare, report_md, slot_labels, window_row  # noqa: E402


async def run(args: argparse.Namespace) -> int:
    out = args.out
    logdir = os.path.join(out, "logs")
    os.makedirs(logdir, exist_ok=True)
    slots = [s for s in args.slots.split(",") if s]
    direct = {s: by_name(s[len(DIRECT) :]) for s in slots if s.startswith(DIRECT)}
    unknown = sorted(set(slots) - set(POLICY_NAMES) - set(direct))
    if unknown:
        raise SystemExit(f"unknown policies in --slots: {', '.join(unknown)}")
    labels = slot_labels(slots)
    spec, base = by_name(args.pair), by_name("base")
    engines = list({e.name: e for e in (base, spec, *direct.values())}.values())
    target = await start_target(args, engines, logdir)
    gws: dict[str, tuple[Proc, str]] = {}
    windows: list[dict[str, Any]] = []
    # slot policy -> (the gateway's policy, the pin its windows set; None: per-policy gateways)
    plan = gateway_plan([s for s in slots if s not in direct], args.gateways)
    try:
        for policy in dict.fromkeys(p for p, _ in plan.values()):
            port = free_port()
            path = os.path.join(logdir, f"gateway-{policy}.yaml")
            with open(path, "w", encoding="utf-8") as fh:  # noqa: ASYNC230 - tiny local file
                yaml.safe_dump(gateway_config(port, spec, base, target.urls, policy, args.profile), fh)
            gw = Proc("gateway", ["serve", "--config", path, "--log-level", "WARNING"], path[:-5] + ".log")
            url = f"http://127.0.0.1:{port}"
            gws[policy] = (gw, url)
            await gw.start()
            await gw.wait_ready(url + "/ready", timeout_s=60)
        await asyncio.sleep(2.5)  # two scrapes, so that every policy sees both engines
        req_path = os.path.join(out, "requests.csv")
        states = os.path.join(out, "states.jsonl")
        with open(req_path, "w", newline="") as fh:  # noqa: ASYNC230 - local results file
            w = csv.DictWriter(fh, fieldnames=["concurrency", "round", "slot", *CSV_FIELDS])
            w.writeheader()
            for conc in args.conc:
                for rnd in range(args.rounds):
                    for label, policy in zip(labels, slots, strict=True):
                        seed = args.seed + rnd  # every slot of a round sends the same requests
                        # ...each with its own prefix cache: no slot reads what another filled
                        salt = f"{label}-c{conc}-r{rnd}"
                        watched = [direct[policy]] if policy in direct else [spec, base]
                        epath = os.path.join(out, "engines", f"c{conc}-r{rnd}-{label}.jsonl")
                        os.makedirs(os.path.dirname(epath), exist_ok=True)
                        gateway = None if policy in direct else gws[plan[policy][0]][0]
                        async with target.watching(watched, Path(epath), gateway):
                            if policy in direct:  # an engine alone, no gateway (e.g. Dynamic SD)
                                e = direct[policy]
                                url = target.urls[e.name]
                                recs, _ = await closed_loop(
                                    url, conc, args, target.time_scale, seed, e.served, salt
                                )
                            else:
                                gw_policy, pin = plan[policy]
                                url = gws[gw_policy][1]
                                if pin is not None:
                                    await set_pin(url, pin)
                                recs, _ = await closed_loop(
                                    url, conc, args, target.time_scale, seed, cache_salt=salt
                                )
                                await save_state(url, states, conc=conc, round=rnd, slot=label)
                        row = window_row(conc, rnd, label, policy, recs)
                        row.update(engine_columns(summarize(load_watch(Path(epath)))))
                        windows.append(row)
                        for r in recs:
                            w.writerow({"concurrency": conc, "round": rnd, "slot": label, **r.row()})
                        print(
                            f"C={conc:<3} round {rnd} {label:>12}: n={row['requests']} "
                            f"TPOT {row['tpot_mean_ms'] or 0:.2f} ms spec {row['spec_share']}",
                            flush=True,
                        )
    finally:
        for gw, _ in gws.values():
            await gw.stop()
        await target.stop()
    with open(os.path.join(out, "windows.csv"), "w", newline="") as fh:  # noqa: ASYNC230
        cw = csv.DictWriter(fh, fieldnames=list(windows[0]))
        cw.writeheader()
        cw.writerows(windows)
    result = compare(windows, labels, seed=args.seed)
    meta = {
        "pair": args.pair,
        "labels": labels,
        "rounds": args.rounds,
        "measure_s": args.measure,
        "min_requests": args.min_requests,
        "target": args.target,
        "gateways": args.gateways,
        "time_scale": target.time_scale,
    }
    with open(os.path.join(out, "report.json"), "w") as fh:  # noqa: ASYNC230
        json.dump({"meta": meta, "result": result}, fh, indent=1)
    with open(os.path.join(out, "report.md"), "w") as fh:  # noqa: ASYNC230
        fh.write(report_md(result, meta))
    return 0


def engine_columns(summary: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """A window's engine record (engine_watch) as three columns over the engines it used:
    preemptions (sum), the longest queue and the fullest KV cache."""

    def over(key: str, how: Any) -> float | None:
        vals = [o[key] for o in summary.values() if o.get(key) is not None]
        return how(vals) if vals else None

    return {
        "preemptions": over("preemptions", sum),
        "max_waiting": over("max_waiting", max),
        "max_kv_usage": over("max_kv_usage", max),
    }


STATIC_PINS = {"always-spec": "spec", "always-base": "base"}
DIRECT = "direct:"  # a slot sent straight to an engine of the set: direct:<engine name>


def gateway_plan(slots: list[str], mode: str) -> dict[str, tuple[str, str | None]]:
    """For each slot policy, the gateway policy that serves it and the pin its windows set
    (``spec``/``base``/``auto``; None with one gateway per policy). With one gateway, the
    slots may hold at most one policy that is not static: the gateway's own."""
    if mode == "per-policy":
        return {p: (p, None) for p in slots}
    own = sorted({p for p in slots if p not in STATIC_PINS})
    if len(own) > 1:
        names = ", ".join(own)
        raise SystemExit(f"one gateway serves one non-static policy, not {names}: use --gateways per-policy")
    gateway = own[0] if own else "adaptive"
    return {p: (gateway, STATIC_PINS.get(p, "auto")) for p in slots}


async def save_state(url: str, path: str, **where: object) -> None:
    """Append the gateway's routing state after a window (mode, predicted speed-up, reasons,
    recent decisions) to ``path``: what explains a window's figures. With it, the gateway's
    stream moves so far (``specgate_stream_moves_total`` by engine and result, cumulative
    over the gateway's life: a slot's are the difference from the previous line), which
    tell what a flip cost."""
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/admin/state") as r:
            body = await r.json() if r.status == 200 else {"status": r.status}
        async with s.get(url + "/metrics") as r:
            moves = stream_moves(await r.text()) if r.status == 200 else {}
    with open(path, "a", encoding="utf-8") as fh:  # noqa: ASYNC230 - one line, local file
        fh.write(json.dumps({**where, "state": body, "stream_moves": moves}) + "\n")


def stream_moves(exposition: str) -> dict[str, float]:
    """``{"<engine>/<result>": count}`` from a gateway's ``/metrics`` page."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name != "specgate_stream_moves":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                key = f"{sample.labels.get('engine', '')}/{sample.labels.get('result', '')}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


async def set_pin(url: str, route: str) -> None:
    async with aiohttp.ClientSession() as s:
        r = await s.post(url + "/admin/route", json={"model": MODEL, "route": route})
        if r.status != 200:
            raise RuntimeError(f"pinning {route}: HTTP {r.status} {(await r.text())[:200]}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default="ngram", help="the speculative engine paired with the plain one")
    p.add_argument(
        "--slots",
        default="adaptive,always-spec,always-base,adaptive",
        help="policies in a round; direct:<engine> sends a slot straight to an engine of the set "
        "(e.g. direct:eagle3-dsd, one engine with Dynamic SD)",
    )
    p.add_argument("--rounds", type=int, default=6, help="rounds per concurrency")
    p.add_argument(
        "--gateways",
        choices=("one", "per-policy"),
        default="one",
        help="one gateway, static slots as pins (default), or one gateway per policy",
    )
    add_load_args(p, conc="1,8,32,64", warmup=1.0, measure=10.0, per="window")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), run)


if __name__ == "__main__":
    raise SystemExit(main())
