"""The package's layers, written down once, and a test that keeps them.

A module may import modules of its own floor or of a floor below it, never above; and no two
modules import each other at run time (an import circle), except through a back-reference that
is only for type checking (``if TYPE_CHECKING:``). The floors, from the ground up:

========  ==================================================================================
floor     modules
========  ==================================================================================
ground    errors, validation, race, race_torch, race_v2, probs, tree, results
blocks    methods, verify_batch, models, watermark (its keyed race, PRFs, detector, settings)
planning  theory, tree_spec, drafting, costs
request   request, auto, cost_store
loop      generation, watermark.audit (replays a transcript through a ``Request``), precision
          (tree rows against one-token rows, race margins), config_choice (the configuration by
          measurement)
batch     batch
api       the ``ersd`` package itself (lazy re-exports of the names above)
edges     serve, integrations (and ``ersd.transformers``, their alias), bench
commands  commands, cli
========  ==================================================================================

Pure algorithms know nothing about models, models nothing about verification; the loop wires
them. The imports are read from the source with :mod:`ast` (every ``import`` statement,
including those inside functions), so the test needs neither torch nor any optional extra.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# (floor, module prefixes); the longest matching prefix decides a module's floor
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground",
        (
            "ersd.errors",
            "ersd.validation",
            "ersd.blockmax",
            "ersd.race",
            "ersd.race_torch",
            "ersd.race_v2",
            "ersd.probs",
            "ersd.tree",
            "ersd.results",
        ),
    ),
    ("blocks", ("ersd.methods", "ersd.verify_batch", "ersd.models", "ersd.watermark")),
    ("planning", ("ersd.theory", "ersd.tree_spec", "ersd.drafting", "ersd.costs")),
    ("request", ("ersd.request", "ersd.auto", "ersd.cost_store")),
    ("loop", ("ersd.generation", "ersd.watermark.audit", "ersd.precision", "ersd.config_choice")),
    ("batch", ("ersd.batch",)),
    ("api", ("ersd",)),
    ("edges", ("ersd.serve", "ersd.integrations", "ersd.transformers", "ersd.bench")),
    ("commands", ("ersd.commands", "ersd.cli")),
]
RANK = {name: i for i, (name, _) in enumerate(FLOORS)}


def floor_of(module: str) -> str:
    best, best_len = None, -1
    for name, prefixes in FLOORS:
        for prefix in prefixes:
            # the package itself ("ersd") holds only its own __init__, not every module below it
            inside = prefix != "ersd" and module.startswith(prefix + ".")
            if (module == prefix or inside) and len(prefix) > best_len:
                best, best_len = name, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add it to FLOORS in {__file__}")
    return best


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.joinpath("ersd").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str) -> str | None:
    """The package module that ``import name`` runs (a name inside a module resolves to it)."""
    mods = modules()
    while name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in mods else None


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".")
            if modules()[module].name != "__init__.py":
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            name = ".".join([*base, *([node.module] if node.module else [])])
        else:
            name = node.module or ""
        # `from ersd.x import y` runs module ersd.x.y when y is one, else ersd.x
        names = [
            f"{name}.{a.name}" if f"{name}.{a.name}" in modules() else name for a in node.names
        ]
    found = []
    for raw in names:
        if raw == "ersd" or raw.startswith("ersd."):
            target = _resolve(raw)
            if target is not None and target != module:
                found.append(target)
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(run-time imports, type-checking-only imports) between modules of the package."""
    runtime: dict[str, set[str]] = defaultdict(set)
    typing_only: dict[str, set[str]] = defaultdict(set)
    for module, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        type_checking: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                type_checking.update(id(n) for stmt in node.body for n in ast.walk(stmt))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph = typing_only if id(node) in type_checking else runtime
                graph[module].update(_targets(module, node))
    return runtime, typing_only


def _is_package(module: str) -> bool:
    path = modules().get(module)
    return path is not None and path.name == "__init__.py"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            # a package's __init__ may re-export its own submodules
            if target.startswith(module + ".") and _is_package(module):
                continue
            if RANK[floor_of(target)] > RANK[floor_of(module)]:
                bad.append(
                    f"{module} ({floor_of(module)}) imports {target} ({floor_of(target)}),"
                    " a floor above it"
                )
    return bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                found.append(sorted(comp))

    for v in sorted(set(graph)):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_on_a_floor() -> None:
    for module in modules():
        floor_of(module)


def test_no_import_runs_up_a_floor() -> None:
    runtime, typing_only = import_graph()
    bad = upward_imports(runtime) + upward_imports(typing_only)
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def test_no_import_circles_at_run_time() -> None:
    runtime, _ = import_graph()
    found = circles(runtime)
    assert not found, "import circles (break one edge, or make it `if TYPE_CHECKING:`):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )


def test_the_checks_catch_an_upward_import_and_a_circle() -> None:
    """The checks themselves can fail: a made-up graph with one of each is reported."""
    graph = {"ersd.race": {"ersd.generation"}, "ersd.methods.sd": {"ersd.methods.base"}}
    graph["ersd.methods.base"] = {"ersd.methods.sd"}
    assert upward_imports(graph) == [
        "ersd.race (ground) imports ersd.generation (loop), a floor above it"
    ]
    assert circles(graph) == [["ersd.methods.base", "ersd.methods.sd"]]


@pytest.mark.parametrize("module", ["ersd.serve.app", "ersd.watermark.audit", "ersd.auto"])
def test_floors_are_read_by_the_longest_prefix(module: str) -> None:
    expected = {"ersd.serve.app": "edges", "ersd.watermark.audit": "loop", "ersd.auto": "request"}
    assert floor_of(module) == expected[module]
