"""Export the corpus as JSONL: OpenAI request bodies, or vLLM's ``custom`` benchmark dataset.

    python -m specgate_lab.workload --n 500 --seed 1 --format vllm --out corpus.jsonl

The ``vllm`` format has one ``{"prompt": ..., "output_tokens": ...}`` object per line, what
``vllm bench serve --dataset-name custom --dataset-path FILE`` reads (the chat turns are
flattened into one user prompt, the system prompt first).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import IO, Any

from specgate_lab.workload.sampler import DEFAULT_MAX_TOKENS_CAP, iter_requests, to_openai_body
from specgate_lab.workload.types import WorkloadRequest


def vllm_custom_row(req: WorkloadRequest) -> dict[str, Any]:
    prompt = "\n\n".join(m["content"] for m in req.messages)
    return {"prompt": prompt, "output_tokens": req.max_tokens}


def write_jsonl(rows: Iterable[dict[str, Any]], out: IO[str]) -> int:
    n = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        n += 1
    return n


def rows(fmt: str, reqs: Iterable[WorkloadRequest], model: str) -> Iterable[dict[str, Any]]:
    for r in reqs:
        if fmt == "vllm":
            yield vllm_custom_row(r)
        elif fmt == "openai":
            yield to_openai_body(r, model, stream=True)
        elif fmt == "advise":  # what ``specgate advise`` reads: the request and an ideal answer
            if r.reference:
                yield {"request": to_openai_body(r, model, stream=False), "answer": r.reference}
        else:
            yield {
                "kind": r.kind,
                "subkind": r.subkind,
                "seed": r.seed,
                "temperature": r.temperature,
                "max_tokens": r.max_tokens,
                "messages": list(r.messages),
                "reference": r.reference,
            }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specgate_lab.workload",
        description="Write N requests of the specgate prompt corpus as JSONL.",
    )
    p.add_argument("--n", type=int, default=200, help="number of requests (default 200)")
    p.add_argument("--seed", type=int, default=1, help="corpus seed (default 1)")
    p.add_argument(
        "--mix", default="default", help="kind weights, e.g. edit=0.4,summary=0.2,rag=0.1,chat=0.3"
    )
    p.add_argument("--temperature", default="default", help="e.g. 0, uniform:0:1, mix:0=0.5,1=0.5")
    p.add_argument("--max-tokens-cap", type=int, default=DEFAULT_MAX_TOKENS_CAP)
    p.add_argument(
        "--format",
        choices=("vllm", "openai", "advise", "full"),
        default="full",
        help="vllm: vllm bench custom dataset; openai: chat request bodies; advise: {request, answer} "
        "records for `specgate advise` (requests with a reference answer only); full: everything",
    )
    p.add_argument("--model", default="model", help="model name for --format openai")
    p.add_argument("--out", default="-", help="output file (default stdout)")
    args = p.parse_args(argv)
    if args.n < 0:
        p.error("--n must be >= 0")
    try:
        reqs = iter_requests(
            args.seed, args.n, args.mix, args.temperature, max_tokens_cap=args.max_tokens_cap
        )
        if args.out == "-":
            n = write_jsonl(rows(args.format, reqs, args.model), sys.stdout)
        else:
            with open(args.out, "w", encoding="utf-8") as fh:
                n = write_jsonl(rows(args.format, reqs, args.model), fh)
    except ValueError as exc:
        p.error(str(exc))
    print(f"wrote {n} records", file=sys.stderr)
    return 0
