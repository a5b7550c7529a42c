"""The Optimizer's insides stay its own: no module of optgen/ or runtime/ reads or writes
a private attribute (``x._name``) of the runtime Optimizer, its record table, its
Launcher or its launch strategies through another object (``opt._steps``,
``core._launch.watch``); they use the public interface (``opt.records``,
``opt.set_step_counts``, ``opt.watch``, ...). ``self._name`` and ``cls._name`` inside a
class are its own business.

The private names are collected from the owners' class bodies (``self._x = ...``,
``def _x``, class-level ``_x: ...``), so a new private field is covered without editing
this test. Tests may still read private fields (they check internals on purpose)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("optgen", "runtime")
# module -> the classes whose private attributes are the Optimizer's
OWNERS = {"runtime/optimizer.py": ("Optimizer",), "runtime/slots.py": ("RecordTable",),
          "runtime/launch.py": ("Launcher",),
          "runtime/strategies/base.py": ("StepInputs", "Fused", "Launches"),
          "runtime/strategies/single.py": ("PerTensor", "Lazy", "Split"),
          "runtime/strategies/runs.py": ("FlatRun", "SegmentedRun"),
          "runtime/strategies/multi.py": ("MultiTensor",),
          "runtime/gradcache.py": ("GradCache", "Verdict")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def owned_names(sources: dict[str, str], owners: dict[str, tuple[str, ...]]) -> set[str]:
    """The private attribute names the ``owners`` classes define or assign on ``self``."""
    names: set[str] = set()
    for path, classes in owners.items():
        for cls in ast.walk(ast.parse(sources[path])):
            if not (isinstance(cls, ast.ClassDef) and cls.name in classes):
                continue
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        _private(node.name):
                    names.add(node.name)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                        and _private(node.target.id):
                    names.add(node.target.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                        isinstance(node.value, ast.Name) and node.value.id == "self" and \
                        _private(node.attr):
                    names.add(node.attr)
    return names


def foreign_accesses(path: str, source: str, names: set[str]) -> list[str]:
    """``path:line: expr._name`` for each access of one of ``names`` through an object
    other than ``self`` or ``cls``."""
    hits = [node for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in names and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
    return [f"{path}:{n.lineno}: {ast.unparse(n)}"
            for n in sorted(hits, key=lambda n: (n.lineno, n.col_offset))]


def _sources() -> dict[str, str]:
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8")
            for folder in SCANNED for f in sorted((ROOT / folder).rglob("*.py"))}


def test_no_module_touches_the_optimizers_private_attributes():
    sources = _sources()
    names = owned_names(sources, OWNERS)
    assert {"_slots", "_launch", "_groups", "_param_kernel"} <= names   # the collector works
    found = [hit for path, src in sources.items() for hit in foreign_accesses(path, src, names)]
    assert not found, ("private attributes of the Optimizer (or its Launcher, records or "
                       "strategies) used from outside; add a public method instead:\n"
                       + "\n".join(found))


def test_the_scan_catches_the_old_accesses():
    """What runtime/checkpoint.py and optgen/torch/__init__.py did before the record
    table: every one of these is found, and ``self``'s own accesses are not."""
    owner = ("class Optimizer:\n    def __init__(self):\n        self._steps = []\n"
             "        self._launch = None\n        self._prepared = []\n"
             "    def _flags(self, i):\n        return self._steps[i]\n")
    names = owned_names({"o.py": owner}, {"o.py": ("Optimizer",)})
    assert names == {"_steps", "_launch", "_prepared", "_flags"}
    user = ("def apply(opt, core, plan):\n    opt._steps = plan['steps']\n"
            "    core._launch.watch(1, 2)\n    core._prepared = [None]\n"
            "    return opt._flags(0), opt._other\n")
    assert foreign_accesses("c.py", user, names) == [
        "c.py:2: opt._steps", "c.py:3: core._launch", "c.py:4: core._prepared",
        "c.py:5: opt._flags"]
    assert foreign_accesses("o.py", owner, names) == []
