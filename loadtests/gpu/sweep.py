"""Closed-loop concurrency sweep through specgate, against the real engine set (on the GPU
machine) or against emulated engines configured like it (anywhere).

For every speculative engine of the set (paired with the one plain engine) and every
routing policy, start ``specgate serve`` with that pair and policy, then for each
concurrency C keep C streaming chat requests from specgate's corpus in flight for
``--warmup + --measure`` seconds. Per point: TTFT, TPOT (mean/p50/p99), output tokens/s,
route shares (from the gateway's ``x-specgate-route`` header), and engine-side deltas of
the spec-decode counters and vLLM's own per-token latency histogram. Each engine's
``/metrics`` page is saved before and after every point, with the gateway's
``/admin/state`` and ``/metrics``.

Real engines (started by engines.py)::

    python3 loadtests/gpu/sweep.py --target real --pairs ngram,eagle3-hi --out /tmp/sweep

Emulated engines configured like the real ones (same spec configs, batch limit and KV
blocks; time-scaled so that a small CPU keeps up)::

    .venv/bin/python loadtests/gpu/sweep.py --target emulated --time-scale 6 --out out/gpu-emu

Requests carry ``ignore_eos: true`` so every answer has exactly ``max_tokens`` tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

from engine_watch import watching  # noqa: E402
from engines import ENGINES, MAX_NUM_SEQS, MODEL, Engine, by_name  # noqa: E402

from gateway.engines.parse import MetricsSample, parse_metrics  # noqa: E402
from gateway.physics import PROFILE_NAMES  # noqa: E402
from gateway.routing.factory import ADAPTIVE, ALWAYS_BASE, ALWAYS_SPEC  # noqa: E402
from gateway.routing.steptime import DEFAULT_PROFILE  # noqa: E402
from specgate_lab.bench.loadgen import stream_chat, tokens_within  # noqa: E402
from specgate_lab.bench.procs import Proc, free_port  # noqa: E402
from specgate_lab.bench.stats import CSV_FIELDS, RequestRecord, summarize  # noqa: E402
from specgate_lab.workload import TemperatureDist, sample, to_openai_body  # noqa: E402

POLICIES = (ALWAYS_BASE, ALWAYS_SPEC, ADAPTIVE)


@dataclass
class Target:
    """Where the engines of the set answer (real: fixed ports; emulated: started here)."""

    urls: dict[str, str]
    time_scale: float
    proc: Proc | None = None
    # the processes whose CPU engine_watch reads: each real engine's API server (from the
    # engines' pids.json), or the one emulator process
    pids: dict[str, int] = field(default_factory=dict)

    def watching(
        self, engines: list[Engine], path: Path, gateway: Proc | None = None
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """Each second while the block runs, what ``engines`` did and the CPU of their
        processes and of ``gateway``'s, into ``path`` (:mod:`engine_watch`)."""
        names = {e.name for e in engines}
        pids = {n: p for n, p in self.pids.items() if n in names or n == "emulator"}
        if gateway is not None and gateway.proc is not None:
            pids["gateway"] = gateway.proc.pid
        return watching({e.name: (self.urls[e.name], e.served) for e in engines}, path, pids)

    async def stop(self) -> None:
        if self.proc is not None:
            await self.proc.stop()


def emulator_yaml(
    engines: list[Engine],
    ports: dict[str, int],
    blocks: dict[str, int],
    profile: str,
    time_scale: float,
    spec_cost_scale: float = 1.0,
    max_num_seqs: int = MAX_NUM_SEQS,
) -> str:
    """An ``specgate emulate --config`` file with the real set's flags (one device timeline)."""
    out = []
    for e in engines:
        d: dict[str, Any] = {
            "served_model_name": e.served,
            "port": ports[e.name],
            "device": "gpu0",
            "profile": profile,
            "max_num_seqs": max_num_seqs,
            "max_model_len": 2048,
            "num_gpu_blocks": blocks.get(e.name, 2730),
        }
        sc = e.spec_config("/models")
        if sc is not None:
            d["speculative_config"] = sc
            d["spec_cost_scale"] = spec_cost_scale
        out.append(d)
    # time_scale lives in the file: `specgate emulate --config` reads it from there.
    return yaml.safe_dump({"time_scale": time_scale, "engines": out}, sort_keys=False)


async def start_target(args: argparse.Namespace, engines: list[Engine], logdir: str) -> Target:
    if args.target == "real":
        known = os.path.join(args.engine_logs, "pids.json")
        pids: dict[str, int] = {}
        try:
            with open(known, encoding="utf-8") as fh:  # noqa: ASYNC230 - tiny local file
                pids = {k: int(v) for k, v in json.load(fh)["pids"].items()}
        except FileNotFoundError:
            pass  # engines started otherwise: no CPU readings
        return Target({e.name: e.url for e in engines}, 1.0, pids=pids)
    ports = {e.name: free_port() for e in engines}
    blocks = json.loads(args.emu_blocks) if args.emu_blocks else {}
    path = os.path.join(logdir, "emulator.yaml")
    with open(path, "w", encoding="utf-8") as fh:  # noqa: ASYNC230 - tiny local file
        fh.write(
            emulator_yaml(
                engines,
                ports,
                blocks,
                args.emu_profile,
                args.time_scale,
                args.emu_spec_cost_scale,
                args.emu_max_num_seqs,
            )
        )
    proc = Proc(
        "emulator",
        ["emulate", "--config", path],
        os.path.join(logdir, "emulator.log"),
    )
    await proc.start()
    for e in engines:
        await proc.wait_ready(f"http://127.0.0.1:{ports[e.name]}/health")
    urls = {e.name: f"http://127.0.0.1:{ports[e.name]}" for e in engines}
    pid = proc.proc.pid if proc.proc is not None else None
    return Target(urls, args.time_scale, proc, {} if pid is None else {"emulator": pid})


def gateway_config(
    port: int, spec: Engine, base: Engine, urls: dict[str, str], policy: str, profile: str = DEFAULT_PROFILE
) -> dict[str, Any]:
    sc = spec.spec or {}
    spec_cfg: dict[str, Any] = {
        "name": spec.name,
        "url": urls[spec.name],
        "served_model_name": spec.served,
        "method": spec.method,
        "k": spec.k,
    }
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if key in sc:
            spec_cfg[key] = sc[key]
    return {
        "server": {"host": "127.0.0.1", "port": port, "max_concurrency": 4096},
        "scrape": {"enabled": True, "interval_s": 1.0, "timeout_s": 1.0, "stale_after_s": 5.0},
        "models": [
            {
                "name": MODEL,
                "pairs": [
                    {
                        "device": "gpu0",
                        "spec": spec_cfg,
                        "base": {"name": base.name, "url": urls[base.name], "served_model_name": base.served},
                    }
                ],
                "timeouts": {"connect_s": 5.0, "first_byte_s": 600.0, "idle_s": 120.0, "total_s": 1200.0},
                "routing": {"policy": policy, "profile": profile},
            }
        ],
    }


async def fetch(session: aiohttp.ClientSession, url: str) -> str:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            return await r.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"# fetch failed: {type(exc).__name__}: {exc}\n"


async def closed_loop(
    gw: str,
    conc: int,
    args: argparse.Namespace,
    scale: float,
    seed: int,
    model: str = MODEL,
    cache_salt: str | None = None,
) -> tuple[list[RequestRecord], float]:
    """C workers, each sending its next request when the last one finished (to ``gw``, a
    gateway, or an engine asked for its served ``model``). Returns the records of requests
    started inside the window and the output tokens delivered in it. ``cache_salt`` (vLLM's
    request field) keeps the window's prompts out of the prefix cache that other windows
    sending the same prompts filled."""
    extra: dict[str, object] = {"ignore_eos": True}
    if cache_salt is not None:
        extra["cache_salt"] = cache_salt
    temps = TemperatureDist.parse(args.temperature)
    url = gw + "/v1/chat/completions"
    w0, w1 = args.warmup, args.warmup + args.measure
    # --min-requests: the window closes once that many requests started in it (after at
    # least --min-measure seconds), --measure being then the most it lasts
    least = getattr(args, "min_requests", 0)
    shortest = w0 + getattr(args, "min_measure", 0.0)
    end = [w1]
    inwin: list[RequestRecord] = []  # with --min-requests: those sent while the window was open
    records: list[RequestRecord] = []
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout * scale, sock_connect=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = time.perf_counter()

        async def worker(i: int) -> None:
            rng = random.Random(seed * 7919 + i)
            while (now := (time.perf_counter() - t0) / scale) < end[0]:
                req = sample(rng, args.mix, temps, max_tokens_cap=args.max_tokens_cap)
                rec = RequestRecord(0.0, req.kind, req.subkind, req.temperature, False)
                body = to_openai_body(req, model, extra=extra)
                records.append(rec)
                if least > 0 and now >= w0:
                    inwin.append(rec)
                    if len(inwin) >= least and now >= shortest:
                        end[0] = now  # this request is the window's last
                await stream_chat(session, url, body, rec, t0, scale)

        tasks = [asyncio.create_task(worker(i)) for i in range(conc)]
        _, pending = await asyncio.wait(tasks, timeout=(w1 + args.drain) * scale)
        for t in pending:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await t
    w1 = end[0]
    window = inwin if least > 0 else [r for r in records if w0 <= r.start < w1]
    tokens = sum(tokens_within(r, w0, w1) for r in records)
    return window, tokens


def engine_delta(before: str, after: str, served: str) -> dict[str, float | None]:
    """Spec-decode and latency deltas of one engine between two /metrics pages."""
    try:
        a, b = parse_metrics(before, served), parse_metrics(after, served)
    except ValueError:
        return {}

    def d(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else y - x

    out: dict[str, float | None] = {}
    drafts, dtoks, acc = d(a.drafts, b.drafts), d(a.draft_tokens, b.draft_tokens), d(a.accepted, b.accepted)
    gen = d(a.generation_tokens, b.generation_tokens)
    out["gen_tokens"] = gen
    out["drafts"] = drafts
    out["acceptance_rate"] = acc / dtoks if acc is not None and dtoks else None
    out["al_drafted"] = 1 + acc / drafts if acc is not None and drafts else None
    tpot_n, tpot_s = d(a.tpot_count, b.tpot_count), d(a.tpot_sum, b.tpot_sum)
    out["engine_tpot_ms"] = 1000 * tpot_s / tpot_n if tpot_s is not None and tpot_n else None
    itl_n, itl_s = d(a.itl_count, b.itl_count), d(a.itl_sum, b.itl_sum)
    out["engine_itl_ms"] = 1000 * itl_s / itl_n if itl_s is not None and itl_n else None
    if _pp(a) and _pp(b) and drafts:
        out["per_pos"] = None
        out.update(
            {f"pos{i}": (y - x) / drafts for i, (x, y) in enumerate(zip(_pp(a), _pp(b), strict=False))}
        )
    return out


def _pp(s: MetricsSample) -> tuple[float, ...]:
    return s.per_position or ()


def _ms(v: Any) -> float | None:
    return None if v is None else round(float(v) * 1000, 2)


async def run_policy(
    args: argparse.Namespace, target: Target, spec: Engine, base: Engine, policy: str, out: str, seed: int
) -> list[dict[str, Any]]:
    tag = f"{spec.name}-{policy}"
    port = free_port()
    cfg_path = os.path.join(out, "logs", f"gateway-{tag}.yaml")
    with open(cfg_path, "w", encoding="utf-8") as fh:  # noqa: ASYNC230 - tiny local file
        yaml.safe_dump(gateway_config(port, spec, base, target.urls, policy, args.profile), fh)
    gw = Proc(
        "gateway",
        ["serve", "--config", cfg_path, "--log-level", "WARNING"],
        os.path.join(out, "logs", f"gateway-{tag}.log"),
    )
    gw_url = f"http://127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    scale = target.time_scale
    try:
        await gw.start()
        await gw.wait_ready(gw_url + "/ready", timeout_s=60)
        await asyncio.sleep(2.5)  # two scrapes, so that the policy sees both engines
        async with aiohttp.ClientSession() as s:
            for conc in args.conc:
                ptag = f"{tag}-c{conc}"
                pages0 = {e.name: await fetch(s, target.urls[e.name] + "/metrics") for e in (spec, base)}
                t_wall = time.monotonic()
                recs, tokens = await closed_loop(gw_url, conc, args, scale, seed)
                wall = time.monotonic() - t_wall
                pages1 = {e.name: await fetch(s, target.urls[e.name] + "/metrics") for e in (spec, base)}
                state = await fetch(s, gw_url + "/admin/state")
                for e in (spec, base):
                    for when, pages in (("before", pages0), ("after", pages1)):
                        with open(os.path.join(out, "metrics", f"{ptag}-{e.name}-{when}.txt"), "w") as fh:  # noqa: ASYNC230
                            fh.write(pages[e.name])
                with open(os.path.join(out, "state", f"{ptag}.json"), "w") as fh:  # noqa: ASYNC230
                    fh.write(state)
                csv_path = os.path.join(out, "requests.csv")
                fresh = not os.path.exists(csv_path)  # noqa: ASYNC240
                with open(csv_path, "a", newline="") as fh:  # noqa: ASYNC230
                    w = csv.DictWriter(fh, fieldnames=["point", *CSV_FIELDS])
                    if fresh:
                        w.writeheader()
                    for r in recs:
                        w.writerow({"point": ptag, **r.row()})
                sm = summarize(recs, args.measure)
                row: dict[str, Any] = {
                    "target": args.target,
                    "spec_engine": spec.name,
                    "method": spec.method,
                    "policy": policy,
                    "concurrency": conc,
                    "requests": sm["requests"],
                    "failures": sm["failures"],
                    "tpot_mean_ms": _ms(sm["tpot_mean_s"]),
                    "tpot_p50_ms": _ms(sm["tpot_p50_s"]),
                    "tpot_p99_ms": _ms(sm["tpot_p99_s"]),
                    "ttft_mean_ms": _ms(sm["ttft_mean_s"]),
                    "ttft_p99_ms": _ms(sm["ttft_p99_s"]),
                    "tokens_per_s": round(tokens / args.measure, 1),
                    "spec_share": (sm["route_share"] or {}).get("spec", 0.0) if sm["route_share"] else None,
                    "errors": sorted({r.error[:80] for r in recs if r.error})[:3],
                    "time_scale": scale,
                    "wall_s": round(wall, 1),
                }
                row["spec"] = engine_delta(pages0[spec.name], pages1[spec.name], spec.served)
                row["base"] = engine_delta(pages0[base.name], pages1[base.name], base.served)
                rows.append(row)
                with open(os.path.join(out, "rows.jsonl"), "a") as fh:  # noqa: ASYNC230
                    fh.write(json.dumps(row) + "\n")
                print(
                    f"{spec.name:>10} {policy:>11} c={conc:<3} n={row['requests']:<4} fail={row['failures']} "
                    f"TPOT mean/p99 {row['tpot_mean_ms']}/{row['tpot_p99_ms']} ms "
                    f"TTFT {row['ttft_mean_ms']} ms "
                    f"tok/s {row['tokens_per_s']} spec {row['spec_share']} "
                    f"acc {row['spec'].get('acceptance_rate')} [{wall:.0f}s]",
                    flush=True,
                )
            gm = await fetch(s, gw_url + "/metrics")
            with open(os.path.join(out, "metrics", f"gateway-{tag}.txt"), "w") as fh:  # noqa: ASYNC230
                fh.write(gm)
    finally:
        await gw.stop()
    return rows


async def sweep(args: argparse.Namespace) -> int:
    out = args.out
    for sub in ("logs", "metrics", "state"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    base = by_name("base")
    pairs = [by_name(n) for n in args.pairs.split(",") if n]
    policies = [p for p in args.policies.split(",") if p]
    engines = [base, *pairs]
    target = await start_target(args, engines, os.path.join(out, "logs"))
    done_base = args.skip_base
    try:
        for spec in pairs:
            for policy in policies:
                if policy == "always-base":
                    if done_base:
                        continue
                    done_base = True
                await run_policy(args, target, spec, base, policy, out, args.seed)
        async with aiohttp.ClientSession() as s:
            for e in engines:
                with open(os.path.join(out, "metrics", f"final-{e.name}.txt"), "w") as fh:  # noqa: ASYNC230
                    fh.write(await fetch(s, target.urls[e.name] + "/metrics"))
    finally:
        await target.stop()
    return 0


def add_target_args(p: argparse.ArgumentParser) -> None:
    """The target (real engines or the emulator configured like them), the requests' content
    and the output folder: what every script that drives the set takes."""
    p.add_argument("--target", choices=("real", "emulated"), required=True)
    p.add_argument("--temperature", default="default", help="temperature distribution (corpus spec)")
    p.add_argument("--max-tokens-cap", type=int, default=256)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--time-scale", type=float, default=1.0, help="emulated: wall seconds per emulated second")
    p.add_argument("--emu-profile", default="h200-qwen3-8b", help="emulated: step-time profile")
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        choices=PROFILE_NAMES,
        help="the gateway's step-time prior (routing.profile), e.g. h200-vllm-0.26.0-measured",
    )
    p.add_argument(
        "--emu-blocks", default="", help='emulated: JSON {"engine": num_gpu_blocks} from real pages'
    )
    p.add_argument(
        "--emu-spec-cost-scale",
        type=float,
        default=1.0,
        help="emulated: what speculation adds to a step x the profile's price (a truth unlike the "
        "gateway's prior, e.g. 0.5 where the real engines verified cheaper than the profile)",
    )
    p.add_argument(
        "--emu-max-num-seqs",
        type=int,
        default=MAX_NUM_SEQS,
        help="emulated: every engine's batch cap (max_num_seqs)",
    )
    p.add_argument(
        "--engine-logs",
        default="/tmp/vlogs",
        help="real: the folder engines.py started the engines with (its pids.json names their processes)",
    )
    p.add_argument("--out", required=True)


def add_load_args(p: argparse.ArgumentParser, *, conc: str, warmup: float, measure: float, per: str) -> None:
    """The target and closed-loop load options of the scripts that measure windows (this
    sweep, and interleave.py); ``per`` names what one measured window is (a point, a window)."""
    add_target_args(p)
    p.add_argument("--conc", default=conc, type=lambda s: [int(x) for x in s.split(",") if x])
    p.add_argument("--warmup", type=float, default=warmup, help=f"seconds before each measured {per}")
    p.add_argument(
        "--measure",
        type=float,
        default=measure,
        help=f"measured seconds per {per} (the most, with --min-requests)",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=0,
        help=f"close a {per} once this many requests started in it (0: --measure seconds each)",
    )
    p.add_argument(
        "--min-measure", type=float, default=5.0, help=f"with --min-requests: the shortest {per} (seconds)"
    )
    p.add_argument("--drain", type=float, default=20.0, help=f"seconds allowed to finish after a {per}")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--mix", default="default", help="corpus mix (default: specgate's default mix)")


def run_main(args: argparse.Namespace, run: Callable[[argparse.Namespace], Awaitable[int]]) -> int:
    """Run ``run(args)``; real engines run in real time."""
    if args.target == "real":
        args.time_scale = 1.0
    return asyncio.run(run(args))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", default=",".join(e.name for e in ENGINES if e.spec is not None))
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--skip-base", action="store_true", help="always-base was measured in an earlier run")
    add_load_args(p, conc="1,4,16,64", warmup=2.0, measure=8.0, per="point")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_main(parse_args(argv), sweep)


if __name__ == "__main__":
    raise SystemExit(main())
