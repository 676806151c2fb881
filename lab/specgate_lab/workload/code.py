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

from specgate_lab.workload.code_templates import CLASS_DOC, CLASS_TEMPLATE, TEMPLATES
from specgate_lab.workload.vocab import ENTITIES, EXCEPTIONS, SEPARATORS, VERB_RENAMES

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
        parts.insert(0, _Part(_fill(CLASS_TEMPLATE, slots), _fill(CLASS_DOC, slots), ""))
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
