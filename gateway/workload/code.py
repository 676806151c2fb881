"""Copy-heavy code-edit prompts: Python modules generated from templates and a seed.

Every module is assembled from a few function templates whose names, fields, constants and
types are drawn from word lists, so the number of distinct files is astronomically large and
the gateway cannot memorise them. Each template exists in an untyped and a typed form
(``⟨…⟩`` segments are type annotations), carries a docstring and marks its magic numbers
(``{c_*}`` slots), so the correct answer of every edit task is computed exactly.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from gateway.workload.vocab import ENTITIES, EXCEPTIONS, SEPARATORS, VERB_RENAMES


@dataclass(frozen=True, slots=True)
class _Template:
    names: tuple[str, ...]  # function-name patterns
    body: str
    doc: str
    consts: dict[str, tuple[str, tuple[str, ...]]]  # slot -> (CONSTANT_NAME, candidate values)


_T = _Template
TEMPLATES: tuple[_Template, ...] = (
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

_CLASS = """class {C}:
    def __init__(self, {k}⟨: str⟩, {f1}⟨: float⟩ = 0.0, {f2}⟨: int⟩ = 0)⟨ -> None⟩:
        self.{k} = {k}
        self.{f1} = {f1}
        self.{f2} = {f2}

    def __repr__(self)⟨ -> str⟩:
        return f"{C}({k}={self.{k}!r}, {f1}={self.{f1}}, {f2}={self.{f2}})"
"""
_CLASS_DOC = "A {E} record."

_SLOT = re.compile(r"\{(\w+)\}")
_HINT = re.compile(r"⟨([^⟩]*)⟩")
_DEF_LINE = re.compile(r"^\s*def .*$", re.MULTILINE)


def _fill(text: str, slots: dict[str, str]) -> str:
    return _SLOT.sub(lambda m: slots.get(m.group(1), m.group(0)), text)


@dataclass(frozen=True, slots=True)
class _Part:
    text: str  # filled text with ⟨hints⟩ still present, constants as {c_*} slots
    doc: str
    fn: str


@dataclass(frozen=True, slots=True)
class CodeModule:
    """One generated module; :meth:`render` gives every form the edit tasks need."""

    parts: tuple[_Part, ...]
    functions: tuple[str, ...]  # function names defined, in order
    constants: tuple[tuple[str, str, str], ...]  # (slot, CONSTANT_NAME, value) per magic number
    entity: str

    def render(self, *, typed: bool = False, documented: bool = False, const_slot: str | None = None) -> str:
        """The module source: optionally annotated, documented, or with the magic number of
        ``const_slot`` lifted into a module-level constant."""
        values = {slot: value for slot, _, value in self.constants}
        const_line = ""
        if const_slot is not None:
            name, value = next((c, v) for s, c, v in self.constants if s == const_slot)
            values[const_slot] = name
            const_line = f"{name} = {value}"
        chunks = []
        for p in self.parts:
            text = _fill(p.text, values)
            text = _HINT.sub((lambda m: m.group(1)) if typed else "", text)
            if not typed:  # PEP 8: no spaces around "=" of an unannotated default
                text = _DEF_LINE.sub(lambda m: m.group(0).replace(" = ", "="), text)
            if documented:
                text = _add_docstring(text, p.doc)
            chunks.append(text)
        body = "\n\n".join(chunks)
        header = "\n\n".join(h for h in (_imports(body, typed), const_line) if h)
        return (header + "\n\n\n" if header else "") + body

    @property
    def plain(self) -> str:
        """Untyped, no docstrings, literal constants: what the prompts show."""
        return self.render()


def generate_module(rng: random.Random, n_functions: int | None = None) -> CodeModule:
    ent = rng.choice(ENTITIES)
    e, es, cls, ks, f1s, f2s = ent
    slots = {
        "E": e,
        "Es": es,
        "C": cls,
        "k": rng.choice(ks),
        "f1": rng.choice(f1s),
        "f2": rng.choice(f2s),
        "exc": rng.choice(EXCEPTIONS),
        "sep": rng.choice(SEPARATORS),
        "comment": rng.choice(("#", ";", "//")),
        "kv": rng.choice(("vip", "wholesale", "internal", "priority", "legacy", "promo")),
    }
    slots["F1"] = slots["f1"].upper()
    slots["F2"] = slots["f2"].upper()
    n = n_functions if n_functions is not None else rng.randint(2, 5)
    chosen = rng.sample(TEMPLATES, k=min(n, len(TEMPLATES)))
    parts: list[_Part] = []
    used: set[str] = set()
    consts: list[tuple[str, str, str]] = []
    for t in chosen:
        fn = _fill(rng.choice(t.names), slots)
        if fn in used:
            continue
        used.add(fn)
        for slot, (cname, values) in t.consts.items():
            if all(s != slot for s, _, _ in consts):
                consts.append((slot, _fill(cname, slots), rng.choice(values)))
        parts.append(_Part(_fill(t.body, dict(slots, fn=fn)), _fill(t.doc, slots), fn))
    if any(cls in p.text for p in parts) or rng.random() < 0.3:
        parts.insert(0, _Part(_fill(_CLASS, slots), _fill(_CLASS_DOC, slots), ""))
    return CodeModule(tuple(parts), tuple(p.fn for p in parts if p.fn), tuple(consts), e)


def _add_docstring(text: str, doc: str) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(("def ", "class ")):
            lines.insert(i + 1, f'    """{doc}"""')
            break
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def _imports(body: str, typed: bool) -> str:
    lines: list[str] = []
    if "time.sleep" in body:
        lines.append("import time")
    if typed:
        abc = [n for n in ("Callable", "Iterable", "Iterator", "Sequence") if re.search(rf"\b{n}\[", body)]
        if abc:
            lines.append(f"from collections.abc import {', '.join(abc)}")
        if re.search(r"\bT\b", body):
            lines.append("from typing import TypeVar")
            lines.append("")
            lines.append('T = TypeVar("T")')
    return "\n".join(lines)


def rename_target(rng: random.Random, module: CodeModule) -> tuple[str, str]:
    """Pick a function of the module and a new name for it."""
    old = rng.choice(module.functions)
    head, _, rest = old.partition("_")
    new = f"{VERB_RENAMES[head]}_{rest}" if head in VERB_RENAMES and rest else f"compute_{old}"
    if new in module.functions:
        new = f"{new}_v2"
    return old, new


def rename(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, text)
