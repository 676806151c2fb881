"""``specgate advise``: should this traffic run with an n-gram speculative engine?

Reads a JSONL log, one record per line: ``{"request": <OpenAI chat or completions
body>, "response": <the OpenAI response object>}`` (or ``"answer": "<text>"`` and
optionally ``"finish_reason"`` instead of the response). Replays every answer through vLLM's n-gram proposer
(:mod:`gateway.advisor.replay`), and writes ``advice.md`` and ``advice.json`` under
``--out``: per class and temperature what the proposer would accept, and the predicted
time per token of a speculative engine against the plain one at each load
(:mod:`gateway.advisor.report`). Bounded: lines over 8 MiB and records beyond
``--max-records`` are skipped and counted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import IO, Any

from gateway.advisor.replay import answer_of, replay
from gateway.advisor.report import (
    MAX_LOAD,
    Advice,
    ClassStats,
    Prediction,
    ProposerAdvice,
    advice_dict,
    bucket_label,
)
from gateway.pipeline.outcome import LookupSettings
from gateway.routing.steptime import DEFAULT_PROFILE, StepModel, get_step_model
from gateway.text.suffix import SuffixSettings
from specgate_lab.advisor.plot import speedup_svg

MAX_LINE_BYTES = 8 << 20
DEFAULT_LOADS = "1,4,8,16,32,64,128"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--log", required=True, help="JSONL of {request, response|answer} records")
    parser.add_argument("--out", default="advice", help="folder for advice.md and advice.json")
    parser.add_argument("-k", type=int, default=5, help="draft tokens per step (num_speculative_tokens)")
    parser.add_argument("--lookup-min", type=int, default=2, help="prompt_lookup_min")
    parser.add_argument("--lookup-max", type=int, default=5, help="prompt_lookup_max")
    parser.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="step-time profile both engines are priced on"
    )
    parser.add_argument("--loads", default=DEFAULT_LOADS, help="requests in flight to price the engines at")
    parser.add_argument("--max-records", type=int, default=200_000, help="records read at most")
    sx = SuffixSettings()
    g = parser.add_argument_group("suffix decoding (vLLM's method: suffix)")
    g.add_argument("--no-suffix", action="store_true", help="replay through the n-gram proposer only")
    g.add_argument("--suffix-k", type=int, default=sx.k, help="num_speculative_tokens")
    g.add_argument("--suffix-depth", type=int, default=sx.depth, help="suffix_decoding_max_tree_depth")
    g.add_argument(
        "--suffix-factor", type=float, default=sx.max_spec_factor, help="suffix_decoding_max_spec_factor"
    )
    g.add_argument(
        "--suffix-min-prob", type=float, default=sx.min_token_prob, help="suffix_decoding_min_token_prob"
    )
    g.add_argument(
        "--suffix-cache",
        type=int,
        default=sx.max_cached_requests,
        help="earlier answers it drafts from (suffix_decoding_max_cached_requests)",
    )


Record = tuple[Any, tuple[str, bool] | None]  # request body, (answer text, ended on a stop)


def records(fh: IO[bytes], limit: int) -> tuple[list[Record], int]:
    """(request body, answer) of each readable record, and how many lines were not."""
    out: list[Record] = []
    bad = 0
    while len(out) < limit:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            break
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            bad += 1
            while (rest := fh.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass  # the rest of an oversized line, in bounded pieces
            continue
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        answer = rec.get("answer")
        if isinstance(answer, str):
            out.append((rec.get("request"), (answer, rec.get("finish_reason") == "stop")))
        else:
            out.append((rec.get("request"), answer_of(rec.get("response"))))
    return out, bad


def advise(recs: list[Record], settings: LookupSettings, suffix: SuffixSettings | None = None) -> Advice:
    adv = Advice(settings, suffix)
    cache = None if suffix is None or adv.answers is None else (suffix, adv.answers)
    for request, answer in recs:
        adv.add(
            None if answer is None else replay(request, answer[0], settings, stopped=answer[1], suffix=cache)
        )
    return adv


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def _class_row(name: str, s: ClassStats) -> str:
    return (
        f"| {name} | {s.requests} | {_pct(s.drafted_share)} | {_pct(s.acceptance_rate)} "
        f"| {_num(s.mean_acceptance_length)} | {s.tokens_per_step:.2f} |"
    )


def _break_even_text(p: Prediction | None) -> str:
    if p is None:
        return f"pays at every load up to {MAX_LOAD} requests in flight"
    if p.load <= 1:
        return "slower at every load"
    return f"stops paying at {p.load:g} requests in flight (≈ {p.requests_per_s:.1f} req/s on plain)"


def _proposer_title(adv: Advice, pa: ProposerAdvice) -> str:
    if pa.method == "ngram":
        s = adv.settings
        return f"n-gram (k = {s.k}, prompt_lookup_min {s.n_min}, prompt_lookup_max {s.n_max})"
    sx = adv.suffix or SuffixSettings()
    return (
        f"suffix decoding (k = {sx.k}, max_tree_depth {sx.depth}, max_spec_factor {sx.max_spec_factor:g}, "
        f"min_token_prob {sx.min_token_prob:g}; earlier answers: the last {sx.max_cached_requests})"
    )


def markdown(adv: Advice, steps: StepModel, loads: list[float], profile: str) -> str:
    st = adv.ngram.total
    props = adv.proposers()
    lines = [
        "# Should this traffic run with a speculative engine?",
        "",
        f"{st.requests} answers replayed ({adv.skipped} records skipped: not a request with an "
        f"answer of 2 tokens or more), {st.tokens} answer tokens; engines priced on the "
        f"`{profile}` step-time profile at the traffic's context ({st.context_tokens:.0f} tokens).",
        "",
    ]
    for pa in props:
        lines += [
            f"## What the {_proposer_title(adv, pa)} proposer would accept",
            "",
            "| class | requests | steps with a draft | drafted tokens accepted | mean acceptance length "
            "| tokens per step |",
            "|---|---|---|---|---|---|",
            _class_row("all", pa.total),
            *(_class_row(f"{kind}, {bucket_label(b)}", cs) for (kind, b), cs in sorted(pa.classes.items())),
            "",
        ]
    names = {"ngram": "n-gram", "suffix": "suffix"}
    head = " | ".join(f"{names[pa.method]} (ms) | speed-up" for pa in props)
    lines += [
        "## Predicted time per output token, by requests in flight",
        "",
        f"| in flight | ≈ req/s (plain) | plain (ms) | {head} |",
        "|---|---|---" + "|---|---" * len(props) + "|",
    ]
    preds = [pa.predict(steps, loads) for pa in props]
    for row in zip(*preds, strict=True):
        p0 = row[0]
        cells = " | ".join(f"{p.spec_ms:.2f} | {p.speedup:.2f}" for p in row)
        lines.append(f"| {p0.load:g} | {p0.requests_per_s:.1f} | {p0.base_ms:.2f} | {cells} |")
    lines.append("")
    for pa in props:
        lines.append(
            f"Over all the traffic, {names[pa.method]} speculation {_break_even_text(pa.break_even(steps))}."
        )
    lines += ["", "![predicted speed-up by load](speedup.svg)", ""]
    for pa in props:
        losers = []
        for (kind, b), cs in sorted(pa.classes.items()):
            be = pa.break_even(steps, cs)
            if be is not None and be.load <= (loads[-1] if loads else MAX_LOAD):
                losers.append(f"- {kind}, {bucket_label(b)} ({cs.requests} requests): {_break_even_text(be)}")
        lines += [
            f"## Classes that would lose with {names[pa.method]} within those loads",
            "",
            *(losers or ["- none"]),
            "",
        ]
    lines += [
        "## Limits",
        "",
        "- Replayed with the gateway's word pieces, not the model's tokenizer: counts per step are "
        "close, not exact. A sampled answer's replay is vLLM's acceptance in expectation.",
        "- The suffix proposer is suffix decoding's method (a tree over the request and one over "
        "earlier answers, frequency-ranked paths, draft length by match length) on bounded "
        "candidate lists, not Arctic Inference's code: its counts are close, not exact. Its "
        "earlier answers are this log's, in its order.",
        "- Model-based drafters (EAGLE-3, draft models, MTP) cannot be replayed without their "
        "weights; this report does not predict them.",
        f"- Step times come from the `{profile}` profile: another GPU or model shifts both engines, "
        "and the break-even with them. A running gateway measures the engines' real per-token "
        "latency (`GET /admin/advice` reports it); measure before deciding.",
        "- Loads are requests in flight on one engine; the request rate beside them is what keeps "
        "that many in flight on the plain engine, from the answers' decoding alone. Beyond the "
        "engines' `--max-num-seqs` requests queue instead of joining the batch.",
        "",
    ]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        settings = LookupSettings(args.k, args.lookup_min, args.lookup_max)
        suffix = None
        if not args.no_suffix:
            suffix = SuffixSettings(
                args.suffix_k, args.suffix_depth, args.suffix_factor, args.suffix_min_prob, args.suffix_cache
            )
        loads = sorted({float(x) for x in str(args.loads).split(",") if x.strip()})
    except ValueError as exc:
        raise SystemExit(f"specgate advise: {exc}") from None
    if not loads or loads[0] < 1:
        raise SystemExit("specgate advise: --loads must be numbers of at least 1")
    with open(args.log, "rb") as fh:
        recs, bad = records(fh, max(0, args.max_records))
    adv = advise(recs, settings, suffix)
    adv.skipped += bad
    if adv.requests == 0:
        raise SystemExit(f"specgate advise: no usable record in {args.log}")
    steps = get_step_model(args.profile, max(1, round(adv.ngram.total.context_tokens)))
    md = markdown(adv, steps, loads, args.profile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "advice.md").write_text(md, encoding="utf-8")
    (out / "speedup.svg").write_text(speedup_svg(adv, steps), encoding="utf-8")
    (out / "advice.json").write_text(
        json.dumps(advice_dict(adv, steps, loads, args.profile), indent=2) + "\n", encoding="utf-8"
    )
    print(md)
    return 0
