"""``--speculative-config`` parsing, with vLLM's keys and its refusal of unknown ones."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.physics.methods import LEGACY_NGRAM, METHODS, NGRAM_METHODS
from gateway.text.suffix import SuffixSettings

# Keys of vLLM's SpeculativeConfig that the emulator accepts (most only matter on a GPU).
KNOWN_KEYS = frozenset(
    {
        "method",
        "num_speculative_tokens",
        "model",
        "prompt_lookup_min",
        "prompt_lookup_max",
        "draft_tensor_parallel_size",
        "rejection_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "quantization",
        "max_model_len",
        "revision",
        "code_revision",
        "disable_padded_drafter_batch",
        "speculative_token_tree",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "enforce_eager",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
    }
)

# Dynamic SD (vLLM >= 0.24): a step whose batch maps to K=0 still pays for the speculative
# machinery. vLLM issue 49548 measured TPOT against an engine without speculation: +6.6 % at
# 2 concurrent requests, +21.6 % at 189. The emulator charges a K=0 step that factor, linear
# in log(batch) between those two points and held constant outside them.
K0_OVERHEAD_POINTS = ((2, 0.066), (189, 0.216))


def k0_overhead(batch: int) -> float:
    """Fractional step-time overhead of a K=0 step of a Dynamic SD engine at ``batch``."""
    (b0, o0), (b1, o1) = K0_OVERHEAD_POINTS
    x = min(1.0, max(0.0, (math.log(max(1, batch)) - math.log(b0)) / (math.log(b1) - math.log(b0))))
    return o0 + (o1 - o0) * x


class SpecConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SpecConfig:
    method: str
    k: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    draft_model: str | None = None
    synthetic: bool = False
    synthetic_rates: tuple[float, ...] = ()
    synthetic_length: float | None = None
    # Dynamic SD: inclusive (start batch, end batch, K) ranges, sorted; () = always k.
    k_per_batch: tuple[tuple[int, int, int], ...] = ()
    suffix: SuffixSettings | None = None  # method "suffix": its suffix_decoding_* settings

    def k_at(self, batch: int) -> int:
        """K for a step of ``batch`` requests: the covering range's, else the last range
        before it (gaps and the tail carry K forward, as vLLM does), capped at ``k``."""
        k = self.k
        for start, _end, rk in self.k_per_batch:
            if start > batch:
                break
            k = min(self.k, rk)
        return k

    @property
    def text_based(self) -> bool:
        """Drafts come from looking up the token sequence (n-gram / suffix)."""
        return self.method in NGRAM_METHODS

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.k}
        if self.text_based:
            d["prompt_lookup_min"] = self.prompt_lookup_min
            d["prompt_lookup_max"] = self.prompt_lookup_max
        if self.draft_model:
            d["model"] = self.draft_model
        if self.synthetic:
            d["rejection_sample_method"] = "synthetic"
        if self.k_per_batch:
            d["num_speculative_tokens_per_batch_size"] = [list(e) for e in self.k_per_batch]
        return d


def _k_per_batch(raw: Any) -> tuple[tuple[int, int, int], ...]:
    """Validate ``num_speculative_tokens_per_batch_size`` as vLLM does: a non-empty list of
    [start, end, K] integer triples, positive ranges with start <= end, K >= 0, ranges
    non-overlapping once sorted, the first starting at batch size 1."""
    if raw is None:
        return ()
    name = "num_speculative_tokens_per_batch_size"
    if not isinstance(raw, list) or not raw:
        raise SpecConfigError(f"{name} must be a non-empty list of [start, end, K] entries")
    out: list[tuple[int, int, int]] = []
    for e in raw:
        if not (
            isinstance(e, list)
            and len(e) == 3
            and all(isinstance(v, int) and not isinstance(v, bool) for v in e)
        ):
            raise SpecConfigError(f"each {name} entry must be [start, end, K] integers, got {e!r}")
        start, end, k = e
        if start <= 0 or end <= 0 or start > end:
            raise SpecConfigError(f"batch-size range [{start}, {end}] must be positive with start <= end")
        if k < 0:
            raise SpecConfigError(f"{name} values must be >= 0, got {k}")
        out.append((start, end, k))
    out.sort()
    if any(b[0] <= a[1] for a, b in itertools.pairwise(out)):
        raise SpecConfigError("batch-size ranges must not overlap")
    if out[0][0] != 1:
        raise SpecConfigError("the first batch-size range must start at 1")
    return tuple(out)


def _int(d: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SpecConfigError(f"{key} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def parse_spec_config(raw: str | dict[str, Any] | None) -> SpecConfig | None:
    """Parse the JSON of ``--speculative-config`` (None or empty: no speculation)."""
    if raw is None or raw == "" or raw == {}:
        return None
    if isinstance(raw, str):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise SpecConfigError(f"--speculative-config is not valid JSON: {e}") from None
    else:
        data = raw
    if not isinstance(data, dict):
        raise SpecConfigError("--speculative-config must be a JSON object")
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise SpecConfigError(f"unknown speculative config keys: {', '.join(unknown)}")
    method = data.get("method")
    if method is None:
        method = "draft_model" if data.get("model") else None
    if method == LEGACY_NGRAM:
        method = "ngram"
    if method not in METHODS:
        raise SpecConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    k = _int(data, "num_speculative_tokens", 1, 32)
    if k is None:
        raise SpecConfigError("num_speculative_tokens is required")
    lo = _int(data, "prompt_lookup_min", 1, 64)
    hi = _int(data, "prompt_lookup_max", 1, 64)
    if lo is None and hi is None:
        lo = hi = 5
    elif lo is None:
        lo = hi
    elif hi is None:
        hi = max(5, lo)
    assert lo is not None and hi is not None
    if lo > hi:
        raise SpecConfigError("prompt_lookup_min must be <= prompt_lookup_max")
    # vLLM 0.20.2 accepts strict (its default), probabilistic and synthetic; "standard" is kept
    # as an alias of strict for configs written against the design brief.
    rsm = data.get("rejection_sample_method", "strict")
    if rsm not in ("strict", "probabilistic", "standard", "synthetic"):
        raise SpecConfigError("rejection_sample_method must be 'strict', 'probabilistic' or 'synthetic'")
    rates_raw = data.get("synthetic_acceptance_rates")
    rates: tuple[float, ...] = ()
    if rates_raw is not None:
        if not isinstance(rates_raw, list) or not all(
            isinstance(r, int | float) and not isinstance(r, bool) and 0 <= r <= 1 for r in rates_raw
        ):
            raise SpecConfigError("synthetic_acceptance_rates must be a list of numbers in [0, 1]")
        rates = tuple(float(r) for r in rates_raw)
        if any(b > a for a, b in itertools.pairwise(rates)):
            raise SpecConfigError("synthetic_acceptance_rates must be non-increasing")
    length = data.get("synthetic_acceptance_length")
    if length is not None and (
        isinstance(length, bool) or not isinstance(length, int | float) or not 1 <= length <= k + 1
    ):
        raise SpecConfigError(f"synthetic_acceptance_length must be a number in [1, {k + 1}]")
    if rsm == "synthetic" and not rates and length is None:
        raise SpecConfigError(
            "rejection_sample_method 'synthetic' needs synthetic_acceptance_rates or "
            "synthetic_acceptance_length"
        )
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise SpecConfigError("model must be a string")
    k_per_batch = _k_per_batch(data.get("num_speculative_tokens_per_batch_size"))
    suffix = _suffix(data, k) if method == "suffix" else None
    return SpecConfig(
        method=str(method),
        k=k,
        prompt_lookup_min=lo,
        prompt_lookup_max=hi,
        draft_model=model,
        synthetic=rsm == "synthetic",
        synthetic_rates=rates,
        synthetic_length=float(length) if length is not None else None,
        k_per_batch=k_per_batch,
        suffix=suffix,
    )


def _suffix(data: dict[str, Any], k: int) -> SuffixSettings:
    """``suffix_decoding_*`` keys (vLLM's defaults where absent)."""
    d = SuffixSettings(k=k)
    depth = _int(data, "suffix_decoding_max_tree_depth", 1, 1024)
    cached = _int(data, "suffix_decoding_max_cached_requests", 0, 1_000_000)
    factor = data.get("suffix_decoding_max_spec_factor", d.max_spec_factor)
    prob = data.get("suffix_decoding_min_token_prob", d.min_token_prob)
    for key, v in (("suffix_decoding_max_spec_factor", factor), ("suffix_decoding_min_token_prob", prob)):
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
            raise SpecConfigError(f"{key} must be a number >= 0, got {v!r}")
    try:
        return SuffixSettings(
            k=k,
            depth=depth if depth is not None else d.depth,
            max_spec_factor=float(factor),
            min_token_prob=float(prob),
            max_cached_requests=cached if cached is not None else d.max_cached_requests,
        )
    except ValueError as e:
        raise SpecConfigError(str(e)) from None
