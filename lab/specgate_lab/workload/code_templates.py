"""Function templates of the generated Python modules (see :mod:`specgate_lab.workload.code`).

``⟨…⟩`` segments are type annotations (kept in the typed form only); ``{c_*}`` slots are
magic numbers that the constant-extraction task lifts into module-level constants.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Template:
    names: tuple[str, ...]  # function-name patterns
    body: str
    doc: str
    consts: dict[str, tuple[str, tuple[str, ...]]]  # slot -> (CONSTANT_NAME, candidate values)


_T = Template
TEMPLATES: tuple[Template, ...] = (
    _T(
        ("filter_{Es}_above", "select_{Es}_over_{f1}", "filter_expensive_{Es}"),
        """def {fn}({Es}⟨: list[{C}]⟩, threshold⟨: float⟩ = {c_thr})⟨ -> list[{C}]⟩:
    result⟨: list[{C}]⟩ = []
    for {E} in {Es}:
        if {E}.{f1} > threshold:
            result.append({E})
    return result
""",
        "Return the {Es} whose {f1} exceeds the threshold.",
        {"c_thr": ("{F1}_THRESHOLD", ("10.0", "25.5", "100.0", "0.75", "42.0"))},
    ),
    _T(
        ("total_{f1}", "sum_{f1}_of_{Es}", "total_{Es}_value"),
        """def {fn}({Es}⟨: Iterable[{C}]⟩)⟨ -> float⟩:
    total⟨: float⟩ = 0.0
    for {E} in {Es}:
        total += {E}.{f1} * {E}.{f2}
    return round(total, {c_digits})
""",
        "Sum {f1} times {f2} over all {Es}, rounded.",
        {"c_digits": ("ROUND_DIGITS", ("2", "3", "4"))},
    ),
    _T(
        ("group_{Es}_by_{k}", "group_by_{k}"),
        """def {fn}({Es}⟨: Iterable[{C}]⟩)⟨ -> dict[str, list[{C}]]⟩:
    groups⟨: dict[str, list[{C}]]⟩ = {}
    for {E} in {Es}:
        groups.setdefault({E}.{k}, []).append({E})
    return groups
""",
        "Group the {Es} by their {k}.",
        {},
    ),
    _T(
        ("price_{E}", "adjusted_{f1}", "final_{f1}_for_{E}"),
        """def {fn}({E}⟨: {C}⟩)⟨ -> float⟩:
    base = {E}.{f1} * {E}.{f2}
    if {E}.{k} == "{kv}":
        base *= 1 - {c_disc}
    return round(base * (1 + {c_tax}), 2)
""",
        "Compute the adjusted {f1} of one {E}, with discount and surcharge.",
        {
            "c_disc": ("DISCOUNT_RATE", ("0.1", "0.15", "0.2", "0.05")),
            "c_tax": ("SURCHARGE_RATE", ("0.07", "0.19", "0.21", "0.08")),
        },
    ),
    _T(
        ("parse_{E}", "parse_{E}_line", "{E}_from_line"),
        """def {fn}(line⟨: str⟩)⟨ -> {C}⟩:
    parts = [p.strip() for p in line.split("{sep}")]
    if len(parts) != {c_fields}:
        raise ValueError(f"wrong number of fields in {line!r}")
    return {C}({k}=parts[0], {f1}=float(parts[1]), {f2}=int(parts[2]))
""",
        "Parse one {sep}-separated line into a {C}.",
        {"c_fields": ("FIELD_COUNT", ("3",))},
    ),
    _T(
        ("fetch_{Es}_with_retry", "retry_{E}_lookup", "load_{Es}_retrying"),
        """def {fn}(fetch⟨: Callable[[], T]⟩, attempts⟨: int⟩ = {c_att}, delay⟨: float⟩ = {c_delay})⟨ -> T⟩:
    last_error⟨: Exception | None⟩ = None
    for attempt in range(attempts):
        try:
            return fetch()
        except {exc} as exc:
            last_error = exc
            time.sleep(delay * (2**attempt))
    raise RuntimeError("giving up after %d attempts" % attempts) from last_error
""",
        "Call fetch until it succeeds, backing off exponentially between attempts.",
        {
            "c_att": ("MAX_ATTEMPTS", ("3", "4", "5", "8")),
            "c_delay": ("BASE_DELAY_S", ("0.1", "0.25", "0.5", "1.0")),
        },
    ),
    _T(
        ("smooth_{f1}", "moving_average_{f1}", "rolling_{f1}"),
        """def {fn}(values⟨: Sequence[float]⟩, window⟨: int⟩ = {c_win})⟨ -> list[float]⟩:
    if window <= 0:
        raise ValueError("window must be positive")
    out⟨: list[float]⟩ = []
    acc = 0.0
    for i, value in enumerate(values):
        acc += value
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out
""",
        "Moving average of the {f1} values over a sliding window.",
        {"c_win": ("WINDOW", ("3", "5", "7", "12", "24"))},
    ),
    _T(
        ("dedupe_{Es}", "unique_{Es}_by_{k}"),
        """def {fn}({Es}⟨: Iterable[{C}]⟩)⟨ -> list[{C}]⟩:
    seen⟨: set[str]⟩ = set()
    unique⟨: list[{C}]⟩ = []
    for {E} in {Es}:
        key = {E}.{k}.lower()
        if key in seen:
            continue
        seen.add(key)
        unique.append({E})
    return unique
""",
        "Drop {Es} whose {k} was already seen, ignoring case.",
        {},
    ),
    _T(
        ("top_{Es}_by_{f1}", "top_{Es}", "best_{Es}"),
        """def {fn}({Es}⟨: list[{C}]⟩, n⟨: int⟩ = {c_n})⟨ -> list[{C}]⟩:
    ranked = sorted({Es}, key=lambda {E}: {E}.{f1}, reverse=True)
    return ranked[:n]
""",
        "Return the n {Es} with the highest {f1}.",
        {"c_n": ("TOP_N", ("3", "5", "10", "20"))},
    ),
    _T(
        ("load_{E}_settings", "load_config", "read_{E}_config"),
        """def {fn}(path⟨: str⟩)⟨ -> dict[str, str]⟩:
    settings⟨: dict[str, str]⟩ = {}
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            line = raw.strip()
            if not line or line.startswith("{comment}"):
                continue
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings
""",
        "Read key=value settings from a file, skipping blanks and comments.",
        {},
    ),
    _T(
        ("clamp_{f1}", "bound_{f1}", "normalize_{f1}"),
        """def {fn}({f1}⟨: float⟩, low⟨: float⟩ = {c_low}, high⟨: float⟩ = {c_high})⟨ -> float⟩:
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(high, {f1}))
""",
        "Clamp a {f1} into the closed range [low, high].",
        {
            "c_low": ("MIN_{F1}", ("0.0", "-1.0", "1.0")),
            "c_high": ("MAX_{F1}", ("100.0", "1.0", "500.0", "9999.0")),
        },
    ),
    _T(
        ("format_{Es}_csv", "{Es}_to_csv", "render_{E}_report"),
        """def {fn}({Es}⟨: Iterable[{C}]⟩)⟨ -> str⟩:
    lines = ["{k},{f1},{f2}"]
    for {E} in {Es}:
        lines.append(f"{{E}.{k}},{{E}.{f1}:.2f},{{E}.{f2}}")
    return "\\n".join(lines)
""",
        "Render the {Es} as CSV text with a header row.",
        {},
    ),
    _T(
        ("count_{f2}_by_{k}", "tally_{Es}", "{f2}_per_{k}"),
        """def {fn}({Es}⟨: Iterable[{C}]⟩)⟨ -> dict[str, int]⟩:
    counts⟨: dict[str, int]⟩ = {}
    for {E} in {Es}:
        counts[{E}.{k}] = counts.get({E}.{k}, 0) + {E}.{f2}
    return dict(sorted(counts.items(), key=lambda kv: kv[1], reverse=True))
""",
        "Total {f2} per {k}, largest first.",
        {},
    ),
    _T(
        ("validate_{E}", "check_{E}", "{E}_problems"),
        """def {fn}({E}⟨: {C}⟩)⟨ -> list[str]⟩:
    problems⟨: list[str]⟩ = []
    if not {E}.{k}:
        problems.append("missing {k}")
    if {E}.{f1} < 0:
        problems.append("negative {f1}")
    if {E}.{f2} > {c_max}:
        problems.append("{f2} above limit")
    return problems
""",
        "List what is wrong with a {E}; empty when it is valid.",
        {"c_max": ("MAX_{F2}", ("100", "1000", "250", "64"))},
    ),
    _T(
        ("chunk_{Es}", "batches_of_{Es}", "split_{Es}"),
        """def {fn}(items⟨: Sequence[T]⟩, size⟨: int⟩ = {c_size})⟨ -> Iterator[list[T]]⟩:
    if size < 1:
        raise ValueError("size must be at least 1")
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
""",
        "Yield consecutive batches of at most size items.",
        {"c_size": ("BATCH_SIZE", ("16", "32", "50", "100", "500"))},
    ),
    _T(
        ("get_{E}", "cached_{E}", "lookup_{E}"),
        """def {fn}({E}_id⟨: str⟩, cache⟨: dict[str, {C}]⟩, loader⟨: Callable[[str], {C}]⟩)⟨ -> {C}⟩:
    if {E}_id in cache:
        return cache[{E}_id]
    {E} = loader({E}_id)
    cache[{E}_id] = {E}
    return {E}
""",
        "Return the {E} with this id, loading and caching it on a miss.",
        {},
    ),
    _T(
        ("percentile_{f1}", "{f1}_quantile", "p_{f1}"),
        """def {fn}(samples⟨: Sequence[float]⟩, q⟨: float⟩ = {c_q})⟨ -> float⟩:
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    index = min(len(ordered) - 1, int(q * len(ordered)))
    return ordered[index]
""",
        "Nearest-rank percentile of the samples.",
        {"c_q": ("DEFAULT_QUANTILE", ("0.5", "0.9", "0.95", "0.99"))},
    ),
    _T(
        ("summarize_{Es}", "{E}_stats", "describe_{Es}"),
        """def {fn}({Es}⟨: Sequence[{C}]⟩)⟨ -> dict[str, float]⟩:
    if not {Es}:
        return {"count": 0.0, "mean": 0.0, "max": 0.0}
    values = [{E}.{f1} for {E} in {Es}]
    return {
        "count": float(len(values)),
        "mean": sum(values) / len(values),
        "max": max(values),
    }
""",
        "Count, mean and maximum of the {f1} of the {Es}.",
        {},
    ),
)

CLASS_TEMPLATE = """class {C}:
    def __init__(self, {k}⟨: str⟩, {f1}⟨: float⟩ = 0.0, {f2}⟨: int⟩ = 0)⟨ -> None⟩:
        self.{k} = {k}
        self.{f1} = {f1}
        self.{f2} = {f2}

    def __repr__(self)⟨ -> str⟩:
        return f"{C}({k}={self.{k}!r}, {f1}={self.{f1}}, {f2}={self.{f2}})"
"""
CLASS_DOC = "A {E} record."
