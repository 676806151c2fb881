"""``specgate profile-fit``: fit the routing's step-time profile to an engine pair.

Scrapes both engines' ``/metrics`` while traffic runs (``--drive``: it sends that traffic
itself, each engine alone over a range of concurrencies), turns the scrapes into windows
of steps (:mod:`gateway.calibrate.windows`), fits :class:`~gateway.physics.FittedProfile`
(:mod:`gateway.physics.fit`) and writes it as JSON for ``routing.profile``. See
docs/profile-fit.md for how long to run, what traffic, and what a fit cannot see.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from gateway.calibrate.run import collect
from gateway.calibrate.windows import pair_windows
from gateway.physics.fit import Window, fit_windows
from gateway.physics.fitted import FittedProfile


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, help="base URL of the speculative engine (http://host:port)")
    p.add_argument("--base", required=True, help="base URL of the plain engine")
    p.add_argument("--out", required=True, help="the profile file to write (JSON; routing.profile: <path>)")
    p.add_argument("--name", default=None, help="the profile's name (default: the file's stem)")
    p.add_argument("--model", default="", help="the model the engines serve, for the record")
    p.add_argument(
        "--duration", type=float, default=300.0, help="seconds to scrape (default %(default)s: 5 minutes)"
    )
    p.add_argument(
        "--drive",
        action="store_true",
        help="send the traffic: each engine alone at each --levels concurrency in turn (an idle pair only)",
    )
    p.add_argument(
        "--levels",
        default="1,2,4,8,16,32,64",
        help="--drive: concurrencies, comma-separated (default %(default)s)",
    )
    p.add_argument(
        "--max-tokens", type=int, default=256, help="--drive: tokens per answer (default %(default)s)"
    )
    p.add_argument(
        "--interval", type=float, default=0.5, help="seconds between scrapes (default %(default)s)"
    )
    p.add_argument(
        "--window", type=float, default=4.0, help="seconds per window of steps (default %(default)s)"
    )
    p.add_argument(
        "--spec-method", default="", help="the speculative method (ngram, eagle3, draft_model, ...)"
    )
    p.add_argument("--spec-model-name", default=None, help="model_name label of the spec engine's metrics")
    p.add_argument("--base-model-name", default=None, help="model_name label of the plain engine's metrics")
    p.add_argument("--windows-out", default=None, help="also write the windows the fit used (JSONL)")


def table(profile: FittedProfile, windows: list[Window]) -> str:
    """One line per window: what was measured and what the fitted profile says."""
    p = profile.params
    head = f"{'engine':6} {'batch':>6} {'q':>5} {'prefill':>7} {'ctx':>6} {'measured':>9} {'fitted':>8}"
    lines = [f"{head} {'err':>6}"]
    for w in sorted(windows, key=lambda w: (w.spec, w.batch)):
        got = p.step_ms(w.batch, w.q, w.ctx) + profile.prefill_ms(int(w.prefill_tokens))
        if w.spec:
            got += p.spec_extra_ms(w.batch)
        err = got / w.step_ms - 1.0
        kind = "spec" if w.spec else "plain"
        lines.append(
            f"{kind:6} {w.batch:6.1f} {w.q:5.2f} {w.prefill_tokens:7.1f} {w.ctx:6.0f} "
            f"{w.step_ms:8.2f}ms {got:6.2f}ms {err:+6.1%}"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    levels = tuple(int(x) for x in str(args.levels).split(",") if x.strip())
    got = asyncio.run(
        collect(
            args.spec,
            args.base,
            duration_s=args.duration,
            interval_s=args.interval,
            drive=args.drive,
            levels=levels,
            max_tokens=args.max_tokens,
            spec_model=args.spec_model_name,
            base_model=args.base_model_name,
        )
    )
    windows = pair_windows(got.spec, got.base, window_s=args.window)
    if args.windows_out:
        with open(args.windows_out, "w", encoding="utf-8") as fh:
            for w in windows:
                fh.write(json.dumps({s: getattr(w, s) for s in w.__slots__}) + "\n")
    spec_k = max((s.spec_k for s in got.spec), default=0)
    out = Path(args.out)
    try:
        prof = fit_windows(
            windows, name=args.name or out.stem, model=args.model, spec_k=spec_k, spec_method=args.spec_method
        )
    except ValueError as exc:
        print(f"profile-fit: {exc} ({len(windows)} windows from {len(got.spec)} scrapes)", file=sys.stderr)
        return 1
    out.write_text(prof.to_json(), encoding="utf-8")
    rep = prof.report
    assert rep is not None
    print(table(prof, windows))
    print(
        f"\n{rep.windows} windows ({rep.windows_spec} speculative), batch {rep.batch_range[0]:.1f}-"
        f"{rep.batch_range[1]:.1f}: fit error rms {rep.rms_rel_error:.1%}, worst {rep.max_rel_error:.1%}"
        + (f"; not fitted (no data that tells): {', '.join(rep.not_fitted)}" if rep.not_fitted else "")
    )
    if got.errors:
        print(f"{got.errors} of {got.requests} driven requests failed", file=sys.stderr)
    print(f"wrote {out}: set routing.profile to its path")
    return 0
