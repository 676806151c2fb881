"""The prompt corpus specgate ships for load tests, benchmarks, the emulator and tests.

Everything is generated from a seed by templates written for this project (no external
data): copy-heavy code edits (rename, add type hints, add docstrings, extract a constant)
over generated Python modules, summaries / extraction / quoting over generated documents,
RAG questions over several passages, and open chat questions.

    rng = random.Random(7)
    req = sample(rng, mix="edit=0.5,chat=0.5", temperature="uniform:0:1")
    body = to_openai_body(req, model="qwen3-8b")
"""

from specgate_lab.workload.sampler import DEFAULT_MAX_TOKENS_CAP, iter_requests, sample, to_openai_body
from specgate_lab.workload.types import (
    DEFAULT_MIX,
    KINDS,
    NOMINAL_OVERLAP,
    SUBKINDS,
    TemperatureDist,
    WorkloadRequest,
    kind_of,
    parse_mix,
)

__all__ = [
    "DEFAULT_MAX_TOKENS_CAP",
    "DEFAULT_MIX",
    "KINDS",
    "NOMINAL_OVERLAP",
    "SUBKINDS",
    "TemperatureDist",
    "WorkloadRequest",
    "iter_requests",
    "kind_of",
    "parse_mix",
    "sample",
    "to_openai_body",
]
