"""The package's own import graph and its circles (strongly connected components).

Every ``import`` / ``from ... import`` inside ``agentgym_lightning`` (with ``plugins/`` and ``envs/``,
which ship as ``agentgym_lightning.plugins`` / ``.envs``) that names another module of the package
is an edge, of one of three kinds:

- ``module``: runs when the importing module is imported (top level, class bodies, try/if blocks);
- ``function``: inside a function body, so it runs when the function is called (a lazy import);
- ``typing``: under ``if TYPE_CHECKING:``, never run but still a dependency of the code's meaning.

An edge points at the module named (``from agentgym_lightning.gateway import Gateway`` ->
``agentgym_lightning.gateway``; ``from agentgym_lightning.policies import hf`` ->
``agentgym_lightning.policies.hf`` when that is a module), and, as Python runs them first, at
the packages above it that the importing module is not itself inside
(``agentgym_lightning.gateway.openai_wire`` from ``episode`` also runs
``agentgym_lightning/gateway/__init__.py``). A circle is a strongly connected
component with more than one module, counted three ways: on module-level edges alone, with
function-level edges added, and with every edge (typing included). The last is the package's
design; the first two are what Python would run into.

    python bench/import_graph.py [--edges] [--json] [--repo PATH]

(``--repo``: another checkout, e.g. ``git archive main | tar -x -C /tmp/main`` for a before-number.)

It also checks the direction of the flow: :data:`LAYERS` puts every module in one layer, in the
order data flows (the data model first, the commands and the viewer last), and an edge of any
kind that runs from a layer to a later one is listed as a *backward import* (a module calling
back up the flow: it is in the wrong room).

Exit status 0 always: this measures, it does not judge (``tests/test_layout.py`` judges).
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

import networkx as nx

PACKAGE = "agentgym_lightning"
# Source folder -> the package name it ships under (pyproject's [tool.setuptools.package-dir]).
FOLDERS = {PACKAGE: PACKAGE, "plugins": f"{PACKAGE}.plugins", "envs": f"{PACKAGE}.envs"}
KINDS = ("module", "function", "typing")

#: The package's layers in flow order, each a name and the modules in it, named without the
#: ``agentgym_lightning.`` prefix (``__init__``: the package itself); a name covers the modules
#: under it (``gateway``: ``gateway.router``, ...). An import may go to an earlier layer or
#: within one, never to a later one. Every module must be in one (a new one is placed here).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data model", ("llm", "trajectory", "spaces", "metrics", "agent_match", "paths", "background_loop", "policy_request", "memory", "failed_episodes", "cpu_threads", "resources", "run_files")),
    ("plugin hooks", ("hookspecs", "plugin_manager", "credit")),
    ("reward bounds, AIR, tracing", ("reward_bounds", "air", "tracing")),
    ("episode", ("episode",)),
    ("gateway", ("gateway",)),
    ("agent, worker", ("agent", "worker", "framework_agent")),
    ("plugins", ("plugins",)),
    ("env", ("env", "registration")),
    ("policies", ("policies",)),
    ("environments", ("envs",)),
    ("rollouts", ("rollouts",)),
    ("judge", ("judge",)),
    ("prompt optimization", ("prompt_optimization",)),
    ("training", ("training",)),
    # The package root (``__init__``) re-exports the public API from every layer, lazily.
    ("commands, viewer, tools, the public API", ("commands", "viewer", "cli", "__main__", "testing", "__init__")),
)


def module_files(repo: Path) -> dict[str, Path]:
    """Every module of the package in checkout ``repo``, by dotted name."""
    modules: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        root = repo / folder
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest package module that ``name`` is or lies in (an attribute import names its module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _packages_above(package: str) -> set[str]:
    """``a.b.c`` -> ``{a, a.b, a.b.c}``."""
    parts = package.split(".") if package else []
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """``(target module, kind, line)`` for each import of a package module in ``path``."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            child_kind = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "module":
                child_kind = "function"
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, "typing")
                for stmt in child.orelse:
                    visit_stmt(stmt, kind)
                continue
            visit_stmt(child, child_kind)

    def visit_stmt(node: ast.AST, kind: str) -> None:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            # `from pkg import submodule` imports the submodule; `from mod import name` the module.
            targets = [f"{source}.{alias.name}" for alias in node.names]
        own_packages = _packages_above(module if is_package else module.rpartition(".")[0])
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is None or resolved == module:
                continue
            found.append((resolved, kind, node.lineno))
            # Importing a.b.c runs a/__init__ and a/b/__init__ first (those we are not inside of).
            for package in _packages_above(resolved.rpartition(".")[0]):
                if package in modules and package not in own_packages and package != module:
                    found.append((package, kind, node.lineno))
        visit(node, kind)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "module")
    return found


def build_graph(repo: Path) -> nx.MultiDiGraph:
    """The package's import graph in checkout ``repo``; each edge carries its ``kind`` and ``line``."""
    modules = module_files(repo)
    graph = nx.MultiDiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        for target, kind, line in imports_of(module, path, modules):
            graph.add_edge(module, target, kind=kind, line=line)
    return graph


def circles(graph: nx.MultiDiGraph, kinds: tuple[str, ...]) -> list[list[str]]:
    """Strongly connected components of more than one module, using only edges of ``kinds``."""
    sub = nx.DiGraph()
    sub.add_nodes_from(graph)
    sub.add_edges_from((a, b) for a, b, kind in graph.edges(data="kind") if kind in kinds)
    return sorted((sorted(c) for c in nx.strongly_connected_components(sub) if len(c) > 1), key=len, reverse=True)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index in ``layers`` of ``module``'s layer (its longest matching name), ``None`` if none."""
    short = "__init__" if module == PACKAGE else module.removeprefix(PACKAGE + ".")
    best: tuple[int, int] | None = None  # (length of the name matched, layer)
    for index, (_, names) in enumerate(layers):
        for name in names:
            if (short == name or short.startswith(name + ".")) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def unplaced(graph: nx.MultiDiGraph, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    """Modules in no layer."""
    return sorted(m for m in graph if layer_of(m, layers) is None)


def backward_imports(
    graph: nx.MultiDiGraph, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS
) -> list[tuple[str, str, str, int]]:
    """``(importer, imported, kind, line)`` for every edge, of any kind, from a layer to a later one."""
    found = set()
    for a, b, data in graph.edges(data=True):
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if la is not None and lb is not None and lb > la:
            found.add((a, b, data["kind"], data["line"]))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="also list the edges inside each circle")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout to read")
    args = parser.parse_args()

    graph = build_graph(args.repo)
    counts = Counter(kind for _, _, kind in graph.edges(data="kind"))
    views = {
        "module-level": ("module",),
        "module+function": ("module", "function"),
        "all (typing too)": KINDS,
    }
    result = {
        "modules": graph.number_of_nodes(),
        "edges": {kind: counts[kind] for kind in KINDS},
        "circles": {name: circles(graph, kinds) for name, kinds in views.items()},
        "unplaced": unplaced(graph),
        "backward_imports": [list(edge) for edge in backward_imports(graph)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['modules']} modules; import edges: " + ", ".join(f"{k} {v}" for k, v in result["edges"].items()))
    print(f"\nlayers: {' -> '.join(name for name, _ in LAYERS)}")
    print(f"modules in no layer: {len(result['unplaced'])}")
    for module in result["unplaced"]:
        print(f"  {module}")
    print(f"backward imports (to a later layer): {len(result['backward_imports'])}")
    for a, b, kind, line in result["backward_imports"]:
        print(f"  {a.removeprefix(PACKAGE + '.')} -> {b.removeprefix(PACKAGE + '.')}  ({kind}, line {line})")
    for name, comps in result["circles"].items():
        print(f"\n{name}: {len(comps)} circle(s), {sum(map(len, comps))} modules in them")
        for comp in comps:
            short = [m.removeprefix(PACKAGE + ".") for m in comp]
            print(f"  [{len(comp)}] " + ", ".join(short))
            if args.edges:
                members = set(comp)
                edges = {(a, b, d["kind"], d["line"]) for a, b, d in graph.edges(data=True)
                         if a in members and b in members and d["kind"] in views[name]}
                for a, b, kind, line in sorted(edges):
                    print(f"      {a.removeprefix(PACKAGE + '.')} -> {b.removeprefix(PACKAGE + '.')}  ({kind}, line {line})")


if __name__ == "__main__":
    main()
