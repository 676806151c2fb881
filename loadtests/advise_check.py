"""Does the advisor predict what a speculative engine then does? Checked on the emulator.

The same corpus requests (seeded, so both engines draw the same answer) go to the
emulated plain engine and then, alone on the device, to the emulated speculative engine
(``--method``: n-gram, or suffix decoding), in a closed loop at each concurrency of
``--conc``. The advisor replays the plain engine's answers (what a team running only that
engine would log) and predicts, per class and temperature bucket, the drafted tokens the
speculative engine would accept, and the speed-up at that load. That engine's own
per-request counters (vLLM's per-request ``metrics.speculative_decoding``) and the two
engines' measured time per output token are the truth. Writes ``check.json`` and
``check.md`` under ``--out``.

    python loadtests/advise_check.py --n 400 --conc 4,32 --out results/advisor
    python loadtests/advise_check.py --n 400 --conc 4,32 --method suffix --out results/advisor/suffix
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.advisor.replay import replay
from gateway.advisor.report import Advice, bucket_label
from gateway.pipeline.outcome import LookupSettings
from gateway.routing.steptime import get_step_model
from gateway.text.suffix import SuffixSettings
from gateway.wire.sse import EventDecoder, json_payloads
from specgate_lab.emulator.launch import pair_launches, start_group
from specgate_lab.workload.sampler import iter_requests, to_openai_body

SETTINGS = LookupSettings(k=5, n_min=2, n_max=5)  # the emulated pair's n-gram engine
SUFFIX = SuffixSettings(k=16)  # the suffix engine of --method suffix (vLLM's other defaults)
SPEC_CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    "suffix": {
        "method": "suffix",
        "num_speculative_tokens": SUFFIX.k,
        "suffix_decoding_max_cached_requests": SUFFIX.max_cached_requests,
    },
}


@dataclass
class Answer:
    text: str = ""
    first: float | None = None
    last: float | None = None
    tokens: int = 0  # the answer's tokens (usage): a speculative step sends several in one event
    stopped: bool = False  # finish_reason "stop" (not max_tokens)
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def tpot_s(self) -> float | None:
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)


async def one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Answer:
    a = Answer()
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        decoder = EventDecoder()
        async for chunk in r.content.iter_any():
            for obj in json_payloads(decoder.feed(chunk)):
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    a.tokens = int(usage.get("completion_tokens") or 0)
                if obj.get("metrics"):
                    a.metrics = obj["metrics"].get("speculative_decoding", {})
                for c in obj.get("choices") or ():
                    a.stopped = a.stopped or c.get("finish_reason") == "stop"
                    piece = (c.get("delta") or {}).get("content")
                    if piece:
                        now = time.monotonic()
                        a.first = a.first if a.first is not None else now
                        a.last = now
                        a.text += piece
    return a


async def closed_loop(url: str, bodies: list[dict[str, Any]], conc: int) -> list[Answer]:
    out: list[Answer | None] = [None] * len(bodies)
    it = iter(range(len(bodies)))
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def worker() -> None:
            for i in it:
                out[i] = await one(session, url, bodies[i])

        await asyncio.gather(*(worker() for _ in range(conc)))
    return [a for a in out if a is not None]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    reqs = list(
        iter_requests(args.seed, args.n, temperature=args.temperature, max_tokens_cap=args.max_tokens)
    )
    launches = pair_launches(
        port_spec=0,
        port_base=0,
        per_request_metrics=True,
        speculative_config=json.dumps(SPEC_CONFIGS[args.method]),
    )
    points = []
    for conc in args.conc:
        # fresh engines per point: a suffix engine would otherwise draft the second point's
        # answers from the first's, the same answers
        group = await start_group(launches, time_scale=args.time_scale)
        spec, base = group.engines
        try:
            got: dict[str, list[Answer]] = {}
            for eng in (base, spec):
                bodies = [
                    to_openai_body(r, eng.handle.name, stream=True, include_usage=True, seeded=True)
                    for r in reqs
                ]
                got[eng.handle.name] = await closed_loop(eng.url, bodies, conc)
            points.append((conc, got[base.handle.name], got[spec.handle.name]))
        finally:
            await group.stop()

    plain0 = points[0][1]
    adv = Advice(SETTINGS, SUFFIX if args.method == "suffix" else None)
    # The suffix engine met the requests in the order the first point sent them (its cache
    # of earlier answers grew that way); the advisor replays the log in the same order.
    suffix = None if adv.answers is None else (SUFFIX, adv.answers)
    replays = [
        replay(to_openai_body(r, "m", stream=False), a.text, SETTINGS, stopped=a.stopped, suffix=suffix)
        for r, a in zip(reqs, plain0, strict=True)
    ]
    for rp in replays:
        adv.add(rp)
    pa = adv.suffix_advice if adv.suffix_advice is not None else adv.ngram
    steps = get_step_model("h200-qwen3-8b", max(1, round(pa.total.context_tokens)))

    # measured acceptance per class, from the spec engine's own counters (first point)
    measured: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    same_text = 0
    for rp, a_plain, a_spec in zip(replays, plain0, points[0][2], strict=True):
        same_text += a_plain.text == a_spec.text
        if rp is None:
            continue
        m = a_spec.metrics
        for key in ((rp.kind, rp.bucket), ("all", -1)):
            acc = measured[key]
            acc[0] += int(m.get("num_accepted_draft_tokens", 0))
            acc[1] += int(m.get("num_draft_tokens", 0))
            acc[2] += 1
    classes = []
    for key, cs in [(("all", -1), pa.total), *sorted(pa.classes.items())]:
        acc, dt, _ = measured[key]
        classes.append(
            {
                "class": "all" if key[0] == "all" else f"{key[0]}, {bucket_label(key[1])}",
                "requests": cs.requests,
                "predicted_acceptance": cs.acceptance_rate,
                "measured_acceptance": acc / dt if dt else None,
            }
        )
    speedups = []
    for conc, plain, specs in points:
        tp = [a.tpot_s for a in plain if a.tpot_s is not None]
        ts = [a.tpot_s for a in specs if a.tpot_s is not None]
        [pred] = pa.predict(steps, [conc])
        speedups.append(
            {
                "concurrency": conc,
                "plain_tpot_ms": 1000 * _mean(tp) / args.time_scale,
                "ngram_tpot_ms": 1000 * _mean(ts) / args.time_scale,
                "measured_speedup": _mean(tp) / _mean(ts),
                "predicted_speedup": pred.speedup,
            }
        )
    return {
        "command": "advise_check.py " + " ".join(sys.argv[1:]),
        "method": args.method,
        "requests": len(reqs),
        "same_answer_on_both_engines": same_text,
        "classes": classes,
        "speedups": speedups,
    }


def markdown(res: dict[str, Any]) -> str:
    lines = [
        f"### The advisor against the emulated {res['method']} engine ({res['requests']} corpus requests)",
        "",
        "| class | requests | predicted acceptance | measured | predicted ÷ measured |",
        "|---|---|---|---|---|",
    ]
    for c in res["classes"]:
        p, m = c["predicted_acceptance"], c["measured_acceptance"]
        ratio = f"{p / m:.3f}" if p is not None and m else "–"
        ps = "–" if p is None else f"{p:.3f}"
        ms = "–" if m is None else f"{m:.3f}"
        lines.append(f"| {c['class']} | {c['requests']} | {ps} | {ms} | {ratio} |")
    lines += [
        "",
        f"| concurrency | plain TPOT (ms) | {res['method']} TPOT (ms) | measured speed-up | predicted "
        "| predicted ÷ measured |",
        "|---|---|---|---|---|---|",
    ]
    for s in res["speedups"]:
        lines.append(
            f"| {s['concurrency']} | {s['plain_tpot_ms']:.2f} | {s['ngram_tpot_ms']:.2f} | "
            f"{s['measured_speedup']:.3f} | {s['predicted_speedup']:.3f} | "
            f"{s['predicted_speedup'] / s['measured_speedup']:.3f} |"
        )
    lines += ["", f"`python loadtests/{res['command']}`", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[4, 32])
    p.add_argument("--temperature", default="default")
    p.add_argument("--method", choices=sorted(SPEC_CONFIGS), default="ngram", help="the spec engine's method")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per emulated second")
    p.add_argument("--out", default="results/advisor")
    args = p.parse_args()
    res = asyncio.run(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    md = markdown(res)
    (out / "check.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
