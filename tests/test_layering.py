"""The package layering of ``gateway/``, enforced on the import statements themselves.

Every module under ``gateway/`` is parsed with :mod:`ast` (module-level imports, imports
inside functions and ``if TYPE_CHECKING:`` blocks alike) and its imports of other
``gateway`` packages become edges of a package graph. Two rules hold on that graph:

(a) no cycles between packages;
(b) a package imports only packages of a strictly lower layer in :data:`LAYERS`;

and one on the graph of the modules themselves:

(d) no cycles between modules, inside a package's folders as across them (a module that
needs another's names at import time and is needed by it is one module split in two, or
a lazy import hiding the loop).

The request's data path is api → routing → proxy → engines: the surface decides with
the routing core, then the proxy forwards to an engine. Imports do not follow that order
for routing. The routing core is pure (no I/O; it imports only ``gateway.text``) and its
value types (``Route``, ``Decision``, ``EngineView``, ``Outcome``, ...) are the vocabulary
every later stage speaks: the proxy reports the route it took, the engine runtime builds
the views the policy reads, telemetry labels by reason. So routing sits *below* proxy and
engines as a leaf library, and the surface (``api``) is what calls it and then the proxy;
nothing on the data path calls back up. Moving ``routing/types.py`` to a lower package of
its own was considered and not done: it would change nothing in the dependency order
(routing already depends on nothing but text) and only split the vocabulary from the
policies that define it. What keeps the later stages from reaching into the policies is
rule (c): ``engines``, ``proxy`` and ``telemetry`` may import only ``gateway.routing.types``
from routing (:data:`ROUTING_VOCABULARY_ONLY`).

The composed demos (``lab/specgate_lab/``: the emulated pair, the gateway and Prometheus in
one process) sit on top and may import anything below them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gateway"

# package -> layer. A package may import only packages of a strictly lower layer (so
# packages of one layer are independent of each other). Top-level modules of ``gateway``
# (cli.py, __main__.py) count as the package "cli".
LAYERS: dict[str, int] = {
    # 0  foundations: pure helpers that import nothing of gateway's.
    "text": 0,  # the cheap tokenizer and the prompt-lookup proposer (gateway and emulator)
    "physics": 0,  # step-time profiles and the shared-device model
    "wire": 0,  # HTTP wire format: header names and hygiene, errors in OpenAI's shape, SSE reading
    # 1  pure cores on the foundations.
    "routing": 1,  # the routing core and its value types (pure: no I/O; see the docstring)
    "workload": 1,  # the prompt corpus and target-QPS schedules
    # 2  what is built from the cores' types.
    "config": 2,  # config models (routing's policy config, wire's header checks)
    "pipeline": 2,  # request pipeline: body → features, answer → outcome (pure, shared with sim)
    # 3  runtime pieces, independent of each other.
    "engines": 3,  # live engine state, /metrics scraping, health checks (data path, last stage)
    "telemetry": 3,  # metrics, traces, logs: beside the data path, never imports api
    "emulator": 3,  # the GPU-free vLLM stand-in: beside the data path, never imports api
    "advisor": 3,  # what speculation would buy on logged traffic (replay + the routing's cost model)
    "envoy": 3,  # Envoy's side of the wire for the Endpoint Picker: HTTP/2 + gRPC, ext_proc, bootstrap
    # 4  the upstream side, and the socket-free simulator.
    "proxy": 4,  # forwards to engines: attempts, failover, relays (data path, after routing)
    "sim": 4,  # discrete-event runs of routing + pipeline on the emulator's engine model
    "peers": 4,  # the optional channel between gateway replicas (beside the data path)
    "fleet": 4,  # pairs that join and leave: the live registry, config reloads, discovery sources
    # 5  the surface, and the benchmark that drives it through sockets.
    "api": 5,  # the surfaces (OpenAI HTTP; Envoy's ext_proc in api/epp): admit, decide, forward, learn
    "bench": 5,  # QPS sweeps and scenarios through real sockets (runs the gateway as processes)
    # 6  composed demos: emulator + gateway + Prometheus; may import anything below.
    "lab": 6,
    # 7  the command-line dispatcher (subcommands are imported by name, lazily).
    "cli": 7,
}

# Packages below routing's decisions on the data path: they speak its vocabulary only.
ROUTING_VOCABULARY_ONLY = frozenset({"engines", "proxy", "telemetry", "peers", "fleet"})
ROUTING_VOCABULARY = "gateway.routing.types"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def package_of(module: str) -> str:
    """``gateway.api.app`` → ``api``; top-level modules (``gateway.cli``) → ``cli``."""
    parts = module.split(".")
    if len(parts) < 2:
        return "cli"
    sub = parts[1]
    return sub if (ROOT / sub).is_dir() else "cli"


def imported_modules(source: str, module: str, *, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in ``source`` (any nesting), ``gateway``'s only."""
    tree = ast.parse(source)
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # ``from gateway import api`` / ``from gateway.routing import types``: names may be modules.
            names = [f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target for a in node.names]
        else:
            continue
        for name in dict.fromkeys(names):  # once per statement and module
            if name == "gateway" or name.startswith("gateway."):
                yield node.lineno, name


def _is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


Edge = tuple[str, str, str, str]  # (from package, to package, file:line, imported module)


def gateway_edges() -> list[Edge]:
    edges: list[Edge] = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        module = module_name(path)
        src = package_of(module)
        for line, target in imported_modules(path.read_text(), module, is_package=path.name == "__init__.py"):
            if target == "gateway":
                continue
            dst = package_of(target)
            if dst != src:
                edges.append((src, dst, f"{rel}:{line}", target))
    return edges


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return gateway_edges()


def module_edges() -> dict[str, set[str]]:
    """module -> the ``gateway`` modules it imports (a package stands for its ``__init__``)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = module_name(path)
        is_package = path.name == "__init__.py"
        targets = graph.setdefault(module, set())
        for _, target in imported_modules(path.read_text(), module, is_package=is_package):
            if target != module and _is_module(target):
                targets.add(target)
    return graph


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(packages - LAYERS.keys())
    assert not missing, f"place the new package(s) {missing} in LAYERS (tests/test_layering.py)"


def test_no_import_cycles_between_packages(edges: list[Edge]) -> None:
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in edges:
        graph.setdefault(src, set()).add(dst)
    cycles = package_cycles(graph)
    detail = [
        f"{e[0]} -> {e[1]} ({e[2]} imports {e[3]})"
        for e in edges
        if any({e[0], e[1]} <= set(c) for c in cycles)
    ]
    assert not cycles, f"import cycles between packages {cycles}:\n" + "\n".join(detail)


# Known module cycles, each to be broken (not to be added to). None today.
KNOWN_MODULE_CYCLES: list[list[str]] = []


def test_no_import_cycles_between_modules() -> None:
    graph = module_edges()
    cycles = [c for c in package_cycles(graph) if c not in KNOWN_MODULE_CYCLES]
    detail = [
        f"{src} -> {dst}"
        for cycle in cycles
        for src in cycle
        for dst in sorted(graph.get(src, ()))
        if dst in cycle
    ]
    assert not cycles, f"import cycles between modules {cycles}:\n" + "\n".join(detail)


def test_no_package_imports_a_layer_above_or_beside_it(edges: list[Edge]) -> None:
    bad = [
        f"{rel} ({src}, layer {LAYERS[src]}) imports {target} ({dst}, layer {LAYERS[dst]})"
        for src, dst, rel, target in edges
        if src in LAYERS and dst in LAYERS and LAYERS[dst] >= LAYERS[src]
    ]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_later_stages_use_only_routings_vocabulary(edges: list[Edge]) -> None:
    bad = [
        f"{rel} ({src}) imports {target}"
        for src, dst, rel, target in edges
        if src in ROUTING_VOCABULARY_ONLY and dst == "routing" and target != ROUTING_VOCABULARY
    ]
    assert not bad, f"only {ROUTING_VOCABULARY} may be imported here:\n" + "\n".join(bad)


def test_side_packages_never_import_the_surface(edges: list[Edge]) -> None:
    bad = [
        f"{rel} imports {target}"
        for src, dst, rel, target in edges
        if src in {"telemetry", "emulator"} and dst == "api"
    ]
    assert not bad, "\n".join(bad)


# -- the import reader itself --------------------------------------------------------------
_SAMPLE = """
from __future__ import annotations
import json
from typing import TYPE_CHECKING
import gateway.text.tokens
from gateway import physics
from . import sse
from ..wire import headers

if TYPE_CHECKING:
    from gateway.config.models import GatewayConfig

def lazy() -> None:
    from gateway.engines.health import HealthChecker

class K:
    def m(self) -> None:
        import specgate_lab.workload as w
"""


def test_the_reader_sees_every_kind_of_import() -> None:
    found = [m for _, m in imported_modules(_SAMPLE, "gateway.proxy.sample")]
    assert sorted(found) == [
        "gateway.config.models",
        "gateway.engines.health",
        "gateway.physics",
        "gateway.proxy.sse",
        "gateway.text.tokens",
        "gateway.wire.headers",
        "specgate_lab.workload",
    ]


def test_the_reader_resolves_relative_imports_of_a_package_init() -> None:
    found = [m for _, m in imported_modules("from .headers import ROUTE\n", "gateway.wire", is_package=True)]
    assert found == ["gateway.wire.headers"]


def test_the_checks_catch_a_cycle_and_an_upward_import() -> None:
    assert package_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert package_cycles({"a": {"b"}, "b": set()}) == []
    assert package_of("gateway.cli") == "cli" and package_of("gateway.proxy.forward") == "proxy"


def test_the_module_graph_holds_the_known_edges() -> None:
    graph = module_edges()
    assert "gateway.routing.adaptive.policy" in graph["gateway.routing.adaptive"]  # the package's re-export
    assert "gateway.routing.config" in graph["gateway.routing.factory"]


def test_the_graph_holds_the_known_edges(edges: list[Edge]) -> None:
    pairs = {(e[0], e[1]) for e in edges}
    # a module-level import, a function-level one (api/fleet.py starts the workers lazily)
    assert ("api", "proxy") in pairs
    assert any(e[3] == "gateway.engines.health" and e[2].startswith("gateway/api/fleet.py") for e in edges)
