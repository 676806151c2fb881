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

The lab tools are not part of ``gateway/``: they are the second distribution's package
``specgate_lab`` (``lab/specgate_lab/``: emulator, workload, simulator, bench, the demos,
the advisor's offline report). Two more rules hold for them:

(e) the runtime never imports the lab: no import of ``specgate_lab`` anywhere under
``gateway/``, and no module name of it in a string (an ``importlib`` call by name); the lab's
commands reach the CLI through an entry point (``gateway.cli.COMMAND_GROUP``);
(f) the lab's own packages are layered like the runtime's (:data:`LAB_LAYERS`); each may
import any of ``gateway``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gateway"
LAB_ROOT = Path(__file__).resolve().parents[1] / "lab" / "specgate_lab"
ROOTS = {"gateway": ROOT, "specgate_lab": LAB_ROOT}

# package -> layer. A package may import only packages of a strictly lower layer (so
# packages of one layer are independent of each other). Top-level modules of ``gateway``
# (cli.py, __main__.py) count as the package "cli".
LAYERS: dict[str, int] = {
    # 0  foundations: pure helpers that import nothing of gateway's.
    "text": 0,  # the cheap tokenizer and the prompt-lookup proposer (gateway and the lab's emulator)
    "physics": 0,  # step-time profiles and the shared-device model
    "wire": 0,  # HTTP wire format: header names and hygiene, errors in OpenAI's shape, SSE reading
    # 1  pure cores on the foundations.
    "routing": 1,  # the routing core and its value types (pure: no I/O; see the docstring)
    # 2  what is built from the cores' types.
    "config": 2,  # config models (routing's policy config, wire's header checks)
    "pipeline": 2,  # request pipeline: body → features, answer → outcome (pure, shared with sim)
    "placement": 2,  # a model's pairs: a regime per pair, one learning, each request placed (pure)
    # 3  runtime pieces, independent of each other.
    "engines": 3,  # live engine state, /metrics scraping, health checks (data path, last stage)
    "telemetry": 3,  # metrics, traces, logs: beside the data path, never imports api
    "advisor": 3,  # live advice: what speculation would buy on this traffic (replay + the cost model)
    "envoy": 3,  # Envoy's side of the wire for the Endpoint Picker: HTTP/2 + gRPC, ext_proc, bootstrap
    # 4  the upstream side.
    "proxy": 4,  # forwards to engines: attempts, failover, relays (data path, after routing)
    "peers": 4,  # the optional channel between gateway replicas (beside the data path)
    "fleet": 4,  # pairs that join and leave: the live registry, config reloads, discovery sources
    "calibrate": 4,  # profile-fit: the step-time profile fitted to an engine pair's /metrics
    # 5  the surface.
    "api": 5,  # the surfaces (OpenAI HTTP; Envoy's ext_proc in api/epp): admit, decide, forward, learn
    # 7  the command-line dispatcher (subcommands are imported by name, lazily).
    "cli": 7,
}

# The lab's packages (lab/specgate_lab/), the same way; its top-level modules (demo,
# promlab, commands) count as "lab".
LAB_LAYERS: dict[str, int] = {
    # 0  independent tools on the runtime.
    "workload": 0,  # the prompt corpus and target-QPS schedules
    "emulator": 0,  # the GPU-free vLLM stand-in
    "advisor": 0,  # `specgate advise`: the advisor's offline report on a JSONL log
    # 1  the socket-free simulator: the routing core on the emulator's engine model.
    "sim": 1,
    # 2  QPS sweeps and scenarios through real sockets (runs the gateway as processes).
    "bench": 2,
    # 3  composed demos (emulator + gateway + Prometheus) and the CLI's table of commands.
    "lab": 3,
}

# Packages below routing's decisions on the data path: they speak its vocabulary only.
ROUTING_VOCABULARY_ONLY = frozenset({"engines", "proxy", "telemetry", "peers", "fleet"})
ROUTING_VOCABULARY = "gateway.routing.types"


def _root_of(path: Path) -> Path:
    return LAB_ROOT if path.is_relative_to(LAB_ROOT) else ROOT


def module_name(path: Path) -> str:
    rel = path.relative_to(_root_of(path).parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def package_of(module: str) -> str:
    """``gateway.api.app`` → ``api``; top-level modules (``gateway.cli``) → ``cli``; the
    lab's alike (``specgate_lab.sim.run`` → ``sim``), its top-level modules → ``lab``."""
    parts = module.split(".")
    top = "lab" if parts[0] == "specgate_lab" else "cli"
    if len(parts) < 2:
        return top
    sub = parts[1]
    return sub if (ROOTS.get(parts[0], ROOT) / sub).is_dir() else top


def imported_modules(
    source: str, module: str, *, is_package: bool = False, of: str = "gateway"
) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in ``source`` (any nesting) of the package
    ``of`` (``gateway``'s by default)."""
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
            if name == of or name.startswith(of + "."):
                yield node.lineno, name


def _is_module(dotted: str) -> bool:
    root = ROOTS.get(dotted.split(".")[0], ROOT)
    path = root.parent.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


Edge = tuple[str, str, str, str]  # (from package, to package, file:line, imported module)


def gateway_edges(tree: str = "gateway") -> list[Edge]:
    """Edges between the packages of one tree (``gateway`` or ``specgate_lab``)."""
    root = ROOTS[tree]
    edges: list[Edge] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        module = module_name(path)
        src = package_of(module)
        source = path.read_text()
        for line, target in imported_modules(source, module, is_package=path.name == "__init__.py", of=tree):
            if target == tree:
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


def module_edges(tree: str = "gateway") -> dict[str, set[str]]:
    """module -> the modules of its tree it imports (a package stands for its ``__init__``)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOTS[tree].rglob("*.py")):
        module = module_name(path)
        is_package = path.name == "__init__.py"
        targets = graph.setdefault(module, set())
        for _, target in imported_modules(path.read_text(), module, is_package=is_package, of=tree):
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


@pytest.mark.parametrize("tree", ["gateway", "specgate_lab"])
def test_no_import_cycles_between_modules(tree: str) -> None:
    graph = module_edges(tree)
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
        f"{rel} imports {target}" for src, dst, rel, target in edges if src == "telemetry" and dst == "api"
    ]
    assert not bad, "\n".join(bad)


# -- the runtime and the lab -----------------------------------------------------------------
# Where the lab's packages lived before they moved out of the runtime (a merge that brings a
# file back there is undone by moving it under lab/specgate_lab/, with its imports).
FORMER_LAB_PACKAGES = ("emulator", "sim", "bench", "workload", "lab")


def test_the_runtime_never_imports_the_lab() -> None:
    bad: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        source = path.read_text()
        module = module_name(path)
        found = imported_modules(source, module, is_package=path.name == "__init__.py", of="specgate_lab")
        bad += [f"{rel}:{line} imports {target}" for line, target in found]
        bad += [
            f"{rel}:{node.lineno} names {node.value!r}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (node.value == "specgate_lab" or node.value.startswith("specgate_lab."))
        ]
    assert not bad, (
        "the runtime must not import the lab (gateway.cli finds its commands by entry point):\n"
        + ("\n".join(bad))
    )


def test_the_lab_tools_live_in_the_lab() -> None:
    back = sorted(
        p.relative_to(ROOT.parent).as_posix()
        for name in FORMER_LAB_PACKAGES
        for p in (ROOT / name).rglob("*.py")
    )
    assert not back, f"lab tools under gateway/ again (move them to lab/specgate_lab/): {back}"


def test_every_lab_package_has_a_layer() -> None:
    packages = {p.name for p in LAB_ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(packages - LAB_LAYERS.keys())
    assert not missing, f"place the new package(s) {missing} in LAB_LAYERS (tests/test_layering.py)"


def test_the_lab_is_layered_too() -> None:
    edges = gateway_edges("specgate_lab")
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in edges:
        graph.setdefault(src, set()).add(dst)
    assert not package_cycles(graph)
    bad = [
        f"{rel} ({src}, layer {LAB_LAYERS[src]}) imports {target} ({dst}, layer {LAB_LAYERS[dst]})"
        for src, dst, rel, target in edges
        if LAB_LAYERS[dst] >= LAB_LAYERS[src]
    ]
    assert not bad, "imports against the lab's layering:\n" + "\n".join(bad)
    assert ("sim", "emulator") in {(e[0], e[1]) for e in edges}  # the reader sees the lab's imports


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
        import gateway.fleet as w
"""


def test_the_reader_sees_every_kind_of_import() -> None:
    found = [m for _, m in imported_modules(_SAMPLE, "gateway.proxy.sample")]
    assert sorted(found) == [
        "gateway.config.models",
        "gateway.engines.health",
        "gateway.fleet",
        "gateway.physics",
        "gateway.proxy.sse",
        "gateway.text.tokens",
        "gateway.wire.headers",
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
