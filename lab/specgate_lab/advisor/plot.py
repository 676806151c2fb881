"""The advice's plot: predicted speed-up of each proposer by requests in flight, as a small
self-contained SVG (no plotting library at run time)."""

from __future__ import annotations

import math
from html import escape

from gateway.advisor.report import Advice
from gateway.routing.steptime import StepModel

LOADS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
COLOURS = {"ngram": "#1f77b4", "suffix": "#d62728"}
NAMES = {"ngram": "n-gram", "suffix": "suffix"}
W, H, LEFT, RIGHT, TOP, BOTTOM = 640, 360, 60, 20, 30, 50


def speedup_svg(adv: Advice, steps: StepModel) -> str:
    """Plain ÷ speculative time per output token over all the traffic, one line per proposer,
    on a log axis of load; the break-even line at 1."""
    series = {pa.method: [p.speedup for p in pa.predict(steps, LOADS)] for pa in adv.proposers()}
    values = [v for ys in series.values() for v in ys] + [1.0]
    lo = min(0.5, math.floor(min(values) * 10) / 10)
    hi = max(1.5, math.ceil(max(values) * 10) / 10)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(load: float) -> float:
        return LEFT + pw * math.log(load) / math.log(LOADS[-1])

    def y(v: float) -> float:
        return TOP + ph * (hi - v) / (hi - lo)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{W / 2}" y="18" text-anchor="middle">'
        "predicted speed-up (plain ÷ speculative time per token)</text>",
    ]
    for load in LOADS:
        out.append(f'<line x1="{x(load):.1f}" y1="{TOP}" x2="{x(load):.1f}" y2="{TOP + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x(load):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{load}</text>')
    steps_y = max(0.1, round((hi - lo) / 5, 1))
    v = lo
    while v <= hi + 1e-9:
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
        v += steps_y
    out.append(
        f'<line x1="{LEFT}" y1="{y(1.0):.1f}" x2="{LEFT + pw}" y2="{y(1.0):.1f}" '
        'stroke="#888" stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">requests in flight</text>')
    for i, (method, ys) in enumerate(series.items()):
        pts = " ".join(f"{x(load):.1f},{y(s):.1f}" for load, s in zip(LOADS, ys, strict=True))
        colour = COLOURS.get(method, "#333")
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out.append(
            f'<text x="{LEFT + pw - 4}" y="{TOP + 16 + 16 * i}" text-anchor="end" fill="{colour}">'
            f"{escape(NAMES.get(method, method))}</text>"
        )
    out.append("</svg>\n")
    return "\n".join(out)
