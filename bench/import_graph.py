"""The package's own import graph and its circles (strongly connected components).

Every ``import`` / ``from ... import`` inside ``agentgym_lightning`` (with ``plugins/`` and ``envs/``,
which ship as ``agentgym_lightning.plugins`` / ``.envs``) that names another module of the package
is an edge, of one of three kinds:

- ``module``: runs when the importing module is imported (top level, class bodies, try/if blocks);
- ``function``: inside a function body, so it runs when the function is called (a lazy import);
- ``typing``: under ``if TYPE_CHECKING:``, never run but still a dependency of the code's meaning.

An edge points at the module named (``from agentgym_lightning.gateway import Gateway`` ->
``agentgym_lightning.gateway``; ``from agentgym_lightning.policies import hf`` ->
``agentgym_lightning.policies.hf`` when that is a module). A circle is a strongly connected
component with more than one module, counted three ways: on module-level edges alone, with
function-level edges added, and with every edge (typing included). The last is the package's
design; the first two are what Python would run into.

    python bench/import_graph.py [--edges] [--json]

Exit status 0 always: this measures, it does not judge.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

import networkx as nx

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "agentgym_lightning"
# Source folder -> the package name it ships under (pyproject's [tool.setuptools.package-dir]).
ROOTS = {REPO / PACKAGE: PACKAGE, REPO / "plugins": f"{PACKAGE}.plugins", REPO / "envs": f"{PACKAGE}.envs"}
KINDS = ("module", "function", "typing")


def module_files() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    modules: dict[str, Path] = {}
    for root, package in ROOTS.items():
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
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                found.append((resolved, kind, node.lineno))
        visit(node, kind)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "module")
    return found


def build_graph() -> nx.MultiDiGraph:
    """The package's import graph; each edge carries its ``kind`` and ``line``."""
    modules = module_files()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="also list the edges inside each circle")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    graph = build_graph()
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
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['modules']} modules; import edges: " + ", ".join(f"{k} {v}" for k, v in result["edges"].items()))
    for name, comps in result["circles"].items():
        print(f"\n{name}: {len(comps)} circle(s), {sum(map(len, comps))} modules in them")
        for comp in comps:
            short = [m.removeprefix(PACKAGE + ".") for m in comp]
            print(f"  [{len(comp)}] " + ", ".join(short))
            if args.edges:
                members = set(comp)
                for a, b, data in sorted(graph.edges(data=True), key=lambda e: (e[0], e[1], e[2]["line"])):
                    if a in members and b in members and data["kind"] in views[name]:
                        print(f"      {a.removeprefix(PACKAGE + '.')} -> {b.removeprefix(PACKAGE + '.')}"
                              f"  ({data['kind']}, line {data['line']})")


if __name__ == "__main__":
    main()
