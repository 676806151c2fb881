"""Latency of the overlap predictor on the request path (run: python scripts/bench_overlap.py).

Targets: p99 ≤ 100 µs for a ~1k-token prompt, ≤ 1 ms for a ~32k-token prompt.
Token counts use the gateway's word-piece tokenizer (≈ 1.1 tokens per word).
"""

from __future__ import annotations

import random
import statistics
import time

from gateway.routing.overlap import predict_overlap
from gateway.text import tokenize

WORDS = [
    "the",
    "model",
    "value",
    "system",
    "data",
    "def",
    "return",
    "class",
    "import",
    "self",
    "result",
    "for",
    "in",
    "if",
    "else",
    "while",
]


def make_prompt(tokens: int, rng: random.Random, code: bool) -> tuple[str, str]:
    parts: list[str] = []
    n = 0
    while n < tokens:
        line = " ".join(rng.choice(WORDS) for _ in range(10))
        parts.append(("    " if code else "") + line)
        n += 11
    body = "\n".join(parts)
    instr = "Refactor this module and return the whole file unchanged otherwise."
    prompt = f"{instr}\n```python\n{body}\n```" if code else f"Summarize this document.\n\n{body}"
    return prompt, instr


def bench(tokens: int, code: bool, reps: int = 3000) -> tuple[int, float, float]:
    rng = random.Random(tokens)
    prompt, instr = make_prompt(tokens, rng, code)
    n_tok = len(tokenize(prompt))
    for _ in range(200):
        predict_overlap(prompt, instr)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        predict_overlap(prompt, instr)
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return n_tok, statistics.median(ts) / 1e3, ts[int(0.99 * len(ts)) - 1] / 1e3


def main() -> None:
    print(f"{'prompt tokens':>14} {'kind':>8} {'p50 µs':>8} {'p99 µs':>8}")
    for tokens in (1_000, 8_000, 32_000):
        for code in (True, False):
            n, p50, p99 = bench(tokens, code)
            print(f"{n:>14} {'code' if code else 'doc':>8} {p50:>8.1f} {p99:>8.1f}")


if __name__ == "__main__":
    main()
