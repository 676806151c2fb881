"""The adaptive package's shape, as the routing core's design holds it: parts composed,
not inherited; a short decision; tunables named, not scattered as bare numbers."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import gateway.routing.adaptive as adaptive
from gateway.routing.adaptive.policy import AdaptivePolicy

PACKAGE = Path(adaptive.__file__).resolve().parent
MAX_DECIDE_LINES = 60
MAX_BARE_NUMBERS = 30


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def bare_numbers(tree: ast.Module) -> list[int]:
    """Lines of the numeric literals other than 0 and 1 in function bodies (argument
    defaults excluded: they are declarations)."""
    defaults: set[int] = set()
    found: dict[int, int] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for d in [*fn.args.defaults, *(x for x in fn.args.kw_defaults if x is not None)]:
                defaults.update(id(n) for n in ast.walk(d))
            for n in ast.walk(fn):
                if isinstance(n, ast.Constant) and type(n.value) in (int, float) and n.value not in (0, 1):
                    found[id(n)] = n.lineno
    return [line for key, line in found.items() if key not in defaults]


def test_decide_is_short() -> None:
    lines = inspect.getsource(AdaptivePolicy.decide).rstrip().splitlines()
    assert len(lines) <= MAX_DECIDE_LINES


def test_no_class_of_the_package_inherits_from_another() -> None:
    classes = {node.name for _, tree in _trees() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    bad = [
        f"{path.name}: {node.name}({ast.unparse(base)})"
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in classes
    ]
    assert not bad, bad


def test_few_bare_numbers_in_function_bodies() -> None:
    found = [f"{p.relative_to(PACKAGE)}:{line}" for p, tree in _trees() for line in bare_numbers(tree)]
    assert len(found) <= MAX_BARE_NUMBERS, found
