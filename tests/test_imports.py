"""No import circle among hotcompile's modules (hotcompile/, passes/ installed as
hotcompile.passes, lowering/, kernels/).

Every ``import`` counts, wherever it stands: at the top, under ``TYPE_CHECKING`` or inside a
function (a deferred import hides a circle, it does not remove it). Two kinds of edge are left
out: a module importing its own package (``import hotcompile`` in ``hotcompile.ops``: the package
is initialised before any of its modules anyway) and an import of a name the package itself
defines resolves to the package's ``__init__``."""

from __future__ import annotations

import ast
import pathlib

from conftest import ROOT

#: source folder -> the package it is installed as (pyproject.toml's package-dir)
PACKAGES = {"hotcompile": "hotcompile", "passes": "hotcompile.passes"}


def modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the installed package."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(root / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def import_graph(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Module -> the hotcompile modules it imports (anywhere in its source)."""

    def owner(name: str) -> str | None:  # the module that defines ``name``
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from package (minus level-1 parents)
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                         for a in node.names]  # fmt: skip
            else:
                continue
            for name in names:
                dep = owner(name)
                if dep and dep != mod and not mod.startswith(dep + "."):
                    deps.add(dep)
        graph[mod] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return found


def test_the_graph_sees_the_package() -> None:
    mods = modules()
    graph = import_graph(mods)
    assert {"hotcompile.graphdiff", "hotcompile.passes.rewrite", "hotcompile.lowering.gate",
            "hotcompile.kernels.dispatch"} <= set(mods)  # fmt: skip
    assert "hotcompile.diffdata" in graph["hotcompile.htmlreport"]
    assert "hotcompile.htmlreport" in graph["hotcompile.graphdiff"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle() -> None:
    assert cycles(import_graph(modules())) == []


def test_diffdata_knows_every_rewritten_path():
    from hotcompile.diffdata import REWRITTEN
    from hotcompile.passes.rewrite import REWRITTEN_PATHS

    assert set(REWRITTEN) == REWRITTEN_PATHS
