"""No target switches outside the target registry: a target is a registered object
(optgen/compiler/targets/ for the compiler, runtime/backends/ for the runtime), and the
rest of optgen asks it (``tg.family``, ``tg.vector``, ``backend.device``...) instead of
comparing its name.

The scan reads every module of optgen/ and runtime/ (ast) outside those two folders and
reports a target name (every name the two registries hold: "llvm", "c", "cuda", "rocm",
"opencl", "metal", "webgpu", and any target registered later) that is
  * compared (==, !=, in, not in, is) or matched (match/case),
  * a key of a dict literal that lists two or more targets (a table switched by name),
  * a subscript (``sources["opencl"]``: data kept per target name),
  * an element of a tuple/list/set literal of two or more targets (``("cuda", "opencl")``:
    a list that an ``in`` then switches on).
Allowed: a target name as a keyword default or argument (``target="llvm"``: which
target to use, not a switch on one), and in strings and docs. "c" is also an axis name
(``"r", "c"``), so alone it counts only where the other operand names a target
(``target``, ``tg``, ``kind``, ``backend``). Comparing an array's device type
(``x.device.type != "cuda"``: torch's device kind) is not a target switch.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("optgen", "runtime")
REGISTRIES = ("optgen/compiler/targets/", "runtime/backends/")
AMBIGUOUS = frozenset({"c"})            # also an axis name
TARGETISH = re.compile(r"\b(target|tg|kind|backend)\b|_target\b|\.target\b")


def target_names() -> frozenset[str]:
    """Every target name the registries hold now: the compiler's targets and the
    runtime's backends (a target registered later is scanned for with no change here)."""
    from optgen.compiler import targets
    from optgen.runtime import backends
    return frozenset(targets.TARGETS) | frozenset(backends.BACKENDS)


def _names_in(node: ast.AST, names: frozenset[str]) -> set[str]:
    """Target names a constant or a literal collection of constants holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & names
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)} & names
    return set()


def _clear(found: set[str], other: str) -> bool:
    """Whether a comparison with target names ``found`` against ``other`` (its source
    text) is no target switch: "c" alone against no target-ish name, or a device type."""
    if other.endswith("device.type"):
        return True
    return found <= AMBIGUOUS and not TARGETISH.search(other)


def switches(source: str, path: str = "<string>") -> list[str]:
    """Every target switch in ``source``: "path:line: what"."""
    tree = ast.parse(source)
    out = []
    names = target_names()          # (the registries as they are now)

    def hit(node: ast.AST, what: str) -> None:
        out.append(f"{path}:{node.lineno}: {what}: {ast.unparse(node)[:90]}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, op in enumerate(operands):
                found = _names_in(op, names)
                rest = " ".join(ast.unparse(o) for j, o in enumerate(operands) if j != i)
                if found and not _clear(found, rest):
                    hit(node, "compares a target name")
                    break
        elif isinstance(node, ast.match_case) and any(
                _names_in(p.value, names) for p in ast.walk(node.pattern)
                if isinstance(p, ast.MatchValue)):
            hit(node.pattern, "matches a target name")
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)} & names
            if len(keys) >= 2 and keys - AMBIGUOUS:
                hit(node, "a table keyed by target name")
        elif isinstance(node, ast.Subscript) and _names_in(node.slice, names) - AMBIGUOUS:
            hit(node, "indexes by a target name")
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            found = _names_in(node, names)
            if len(found) >= 2 and found - AMBIGUOUS:
                hit(node, "a list of target names")
    return out


def scan(root: Path) -> list[str]:
    out = []
    for folder in SCANNED:
        for file in sorted((root / folder).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            if not rel.startswith(REGISTRIES):
                out += switches(file.read_text(encoding="utf-8"), rel)
    return out


def test_no_target_switch_outside_the_registries():
    found = scan(ROOT)
    assert not found, ("target names switched on outside optgen/compiler/targets/ and "
                       "runtime/backends/ (ask the registry instead):\n" + "\n".join(found))


@pytest.mark.parametrize("code", [
    'if name == "llvm": pass',
    'ok = target != "cuda"',
    'x = tg.name in ("cuda", "opencl")',
    'if kind not in ("llvm", "c"): pass',
    'QUANT_GPU = ("cuda", "opencl")',
    'SUFFIX = {"cuda": "cu", "opencl": "cl", "webgpu": "wgsl"}',
    'p = manifest["sources"]["opencl"]',
    'x = schedule(k, vector=tg.name == "llvm")',
    'if target == "c": pass',
    'match target:\n    case "rocm": pass',
])
def test_scanner_finds_the_switches_of_before(code):
    """The switches the code had before targets were registered (optgen/compiler/
    targets.py's status chain, tvm_backend.target_for, variants.QUANT_GPU, manifest's
    SOURCE_SUFFIX, runtime/manifest.py, pipeline.schedule) are each found."""
    assert switches(code), code


@pytest.mark.parametrize("code", [
    'def build(spec, target: str = "llvm"): pass',
    'x = target_for("llvm")',
    'register(op, target="c", level=99)',
    'if which not in ("r", "c"): pass',
    'd = {"b": "B", "r": "R", "c": "C"}',
    'if space.endswith("c") and "c" in reduced: pass',
    'dev = str(x.device) if x.device.type != "cuda" else "cuda:0"',
    'msg = "optgen build adam --target llvm,c,opencl"',
])
def test_scanner_allows_what_is_no_switch(code):
    assert not switches(code), switches(code)


def test_the_names_come_from_the_registries(monkeypatch):
    """The scanner reads its names from the registries: every registered target, and a
    target registered later, with no list here to update."""
    from optgen.compiler import targets
    from optgen.runtime import backends
    assert target_names() == set(targets.TARGETS) | set(backends.BACKENDS)
    assert {"llvm", "c", "cuda", "rocm", "opencl", "metal", "webgpu"} <= target_names()
    code = 'if target == "vulkan": pass\nKINDS = ("vulkan", "cuda")'
    assert not switches(code.split("\n")[0])
    monkeypatch.setitem(targets.TARGETS, "vulkan", targets.get("metal"))
    assert len(switches(code)) == 2, switches(code)


# -- the two registries agree ------------------------------------------------------------
def test_compiler_and_runtime_registries_agree():
    """The compiler (optgen.compiler.targets) and the runtime (optgen.runtime.backends)
    cannot import each other, so what both must know is checked here: every runtime
    backend is a compiler target, and both compute the same artifact key for it."""
    from optgen.compiler import targets
    from optgen.runtime import backends
    assert set(backends.BACKENDS) <= set(targets.TARGETS)
    for name, tg in targets.TARGETS.items():
        for archs in ((), ("sm_75",), ("sm_80", "sm_90a")) if tg.takes_arch else ((),):
            full = tg.parse_archs(",".join(archs) or None)
            assert tg.key(full) == backends.get(name).target_key(full), (name, archs)
    assert backends.get("metal").launcher is None and backends.get("metal").device == "metal"


def test_both_registries_give_the_core_the_same_target_facts():
    """The kernel core's cache key and artifact checks name no target: their callers
    pass the facts (optgen.core.manifest.TargetFacts) from their own registry. For
    every target the runtime runs, the compiler's answer must be the runtime's: whether
    the key names this machine, whether a device ABI is in the manifest, and which
    files beyond the library the runtime reads (what the compiler records sizes and
    hashes of is what the runtime verifies)."""
    from optgen.compiler import targets
    from optgen.runtime import backends
    manifest = {"sources": {tg.source_key: f"kernels.{tg.source}"
                            for tg in targets.TARGETS.values()}}
    for name, backend in backends.BACKENDS.items():
        tg = targets.get(name)
        assert tg.machine_bound == backend.machine_bound, name
        assert tg.device_abi == backend.device_abi, name
        assert tg.needs_tvm == backend.needs_tvm, name
        assert tg.files(manifest) == backend.files(manifest), name
    assert targets.get("llvm").machine_bound and not targets.get("c").machine_bound
    assert targets.get("opencl").files(manifest) == ["kernels.cl"]


def test_registry_errors():
    from optgen.compiler import targets
    with pytest.raises(ValueError, match=r"unknown target 'vulkan'; targets: llvm, c, cuda"):
        targets.get("vulkan")
    with pytest.raises(ValueError, match=r"target 'llvm' is registered twice"):
        targets.register(targets.get("llvm"))
    with pytest.raises(ValueError, match=r"--arch applies to the cuda target only, not 'c'"):
        targets.archs_for(targets.get("c"), "sm_90")
