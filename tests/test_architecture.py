"""The shape of the code: optgen/ and runtime/ import each other without cycles, and no
module is larger than MAX_LINES.

The import graph counts every import of every module, at module level and inside
functions alike (a function-level import defers a dependency, it does not remove it),
with relative imports resolved. Its nodes are the modules of the installed package:
optgen/ is ``optgen`` and ``optgen.compiler``, runtime/ is ``optgen.runtime``, and
specs/ and templates/ are ``optgen.specs`` and ``optgen.templates`` (pyproject.toml,
package-dir). ``from P import m`` is an edge to the module P.m where m is one, else to
P; ``import a.b.c`` is an edge to the longest of a.b.c, a.b, a that is a module. That
importing P.m also runs P's ``__init__`` is not counted: a package's ``__init__``
re-exports its own submodules, so counting it would make every such package a cycle.
Imports of anything outside these packages (numpy, tvm, torch, ...) are not edges.
"""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> folder, as pyproject.toml's [tool.setuptools.package-dir] installs them
PACKAGES = {"optgen": "optgen", "optgen.compiler": "optgen/compiler",
            "optgen.compiler.targets": "optgen/compiler/targets",
            "optgen.core": "optgen/core", "optgen.torch": "optgen/torch",
            "optgen.core.formats": "optgen/core/formats",
            "optgen.runtime": "runtime", "optgen.runtime.artifact": "runtime/artifact",
            "optgen.runtime.backends": "runtime/backends",
            "optgen.runtime.schedules": "runtime/schedules",
            "optgen.runtime.strategies": "runtime/strategies", "optgen.specs": "specs",
            "optgen.templates": "templates", "optgen.transforms": "optgen/transforms"}
CHECKED = ("optgen", "runtime")   # the folders whose modules must stay small
MAX_LINES = 400


@dataclass(frozen=True)
class Import:
    source: str        # the importing module
    target: str        # the imported module
    path: str          # the importing file, relative to the repository root
    line: int
    in_function: bool  # inside a function body (a deferred import)

    def __str__(self) -> str:
        where = ", in a function" if self.in_function else ""
        return f"{self.source} -> {self.target} ({self.path}:{self.line}{where})"


def modules() -> dict[str, Path]:
    """Module name -> file, for every module of PACKAGES (packages by their __init__)."""
    out = {}
    for package, folder in PACKAGES.items():
        for file in sorted((ROOT / folder).glob("*.py")):
            out[package if file.name == "__init__.py" else f"{package}.{file.stem}"] = file
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    parts = name.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [t for a in node.names if (t := _resolve(a.name, known))]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        pkg = ".".join(base + ([node.module] if node.module else []))
    else:
        pkg = node.module
    out = []
    for a in node.names:
        sub = f"{pkg}.{a.name}"
        target = sub if sub in known else _resolve(pkg, known)
        if target:
            out.append(target)
    return out


def _imports_in(tree: ast.AST):
    """(import node, inside a function?) for every import statement of ``tree``."""
    def visit(node: ast.AST, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    yield from visit(tree, False)


def import_graph() -> list[Import]:
    known = modules()
    edges = []
    for module, file in known.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        for node, in_function in _imports_in(tree):
            for target in _targets(node, module, file.name == "__init__.py", known):
                if target != module:
                    edges.append(Import(module, target, str(file.relative_to(ROOT)),
                                        node.lineno, in_function))
    return edges


def cycles(edges: list[Import]) -> list[tuple[list[str], list[Import], list[Import]]]:
    """The strongly connected components of more than one module (Tarjan), each as its
    modules, one cycle through them (the shortest through its first module, as the
    imports in order) and the imports inside functions between them (the usual way a
    cycle hides)."""
    graph: dict[str, list[Import]] = {}
    for e in edges:
        graph.setdefault(e.source, []).append(e)
        graph.setdefault(e.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph[v]:
            if e.target not in index:
                connect(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [(sorted(c), _shortest_cycle(graph, c, min(c)), [
        e for v in sorted(c) for e in graph[v] if e.target in c and e.in_function])
        for c in components]


def _shortest_cycle(graph: dict[str, list[Import]], component: set[str],
                    start: str) -> list[Import]:
    """The shortest cycle through ``start`` within its component (breadth-first)."""
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in graph[v]:
                if e.target not in component:
                    continue
                if e.target == start:
                    path = [e]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if e.target not in came:
                    came[e.target] = e
                    nxt.append(e.target)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def test_packages_match_pyproject():
    """PACKAGES is how pyproject.toml installs the folders."""
    tomllib = pytest.importorskip("tomllib")   # Python 3.11+
    with open(ROOT / "pyproject.toml", "rb") as f:
        installed = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    assert installed == PACKAGES


def test_the_import_graph_sees_every_kind_of_import():
    """Guards the collector: module-level and function-level, absolute and relative."""
    edges = {(e.source, e.target, e.in_function) for e in import_graph()}
    assert ("optgen.compiler.plan", "optgen.compiler.verify", False) in edges   # from .verify
    assert ("optgen.compiler.anchors", "optgen.compiler.pipeline", True) in edges   # in a function
    assert ("optgen.compiler.pipeline", "optgen.core.cache", False) in edges    # absolute
    assert ("optgen.dsl", "optgen.compiler.loader", False) in edges      # from .compiler import
    assert len({e.source for e in import_graph()}) > 30


def test_no_import_cycles():
    """No module imports (directly or through others) a module that imports it back, not
    even through an import inside a function."""
    found = cycles(import_graph())
    report = "\n".join(
        f"{len(tangle)} modules import each other: {', '.join(tangle)}; for example\n"
        + "  " + " -> ".join([c[0].source] + [e.target for e in c]) + ":\n"
        + "\n".join(f"    {e}" for e in c)
        + "\n  imports inside functions among them:\n" + "\n".join(f"    {e}" for e in deferred)
        for tangle, c, deferred in found)
    assert not found, f"import cycles:\n{report}"


def test_no_module_is_too_large():
    """Every .py file under optgen/ and runtime/ has at most MAX_LINES lines."""
    sizes = {}
    for folder in CHECKED:
        for dirpath, dirnames, files in os.walk(ROOT / folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(dirpath) / name
                    with open(path, encoding="utf-8") as f:
                        sizes[str(path.relative_to(ROOT))] = sum(1 for _ in f)
    large = {p: n for p, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not large, (f"modules over {MAX_LINES} lines (split them along a seam):\n"
                       + "\n".join(f"    {p}: {n} lines" for p, n in large.items()))


def test_the_compiler_reaches_the_runtime_only_through_the_core():
    """The compiler (optgen.compiler) imports no module of the runtime (optgen.runtime):
    what both read (formats, keys, the manifest checks, ...) is the kernel core's
    (optgen.core), and the runtime calls the compiler, never the other way."""
    wrong = [e for e in import_graph() if e.source.startswith("optgen.compiler")
             and (e.target == "optgen.runtime" or e.target.startswith("optgen.runtime."))]
    assert not wrong, ("the compiler imports the runtime (move what both need to "
                       "optgen.core):\n" + "\n".join(f"    {e}" for e in wrong))


def test_the_core_imports_nothing_of_optgen_outside_it():
    """optgen.core depends on no other part of optgen, so the compiler and the runtime
    can both import it without importing each other."""
    wrong = [e for e in import_graph() if e.source.startswith("optgen.core")
             and not (e.target == "optgen.core" or e.target.startswith("optgen.core."))]
    assert not wrong, ("the kernel core imports optgen outside optgen.core:\n"
                       + "\n".join(f"    {e}" for e in wrong))
