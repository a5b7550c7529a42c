"""No target switches outside the target registries: a target is a registered object
(optgen/core/targets.py for the facts both sides know, optgen/compiler/targets/ for the
compiler, runtime/backends/ for the runtime), and the rest of optgen asks it
(``tg.family``, ``tg.vector``, ``backend.device``...) instead of comparing its name; and
each fact is stated once, in the core, which both other registries read.

The scan reads every module of optgen/ and runtime/ (ast) outside those registries and
reports a target name (every name the registries hold: "llvm", "c", "cuda", "rocm",
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
REGISTRIES = ("optgen/core/targets.py", "optgen/compiler/targets/", "runtime/backends/")
AMBIGUOUS = frozenset({"c"})            # also an axis name
TARGETISH = re.compile(r"\b(target|tg|kind|backend)\b|_target\b|\.target\b")


def target_names() -> frozenset[str]:
    """Every target name the registries hold now: the core's facts, the compiler's
    targets and the runtime's backends (a target registered later is scanned for with no
    change here)."""
    from optgen.compiler import targets
    from optgen.core import targets as core_targets
    from optgen.runtime import backends
    return frozenset(core_targets.FACTS) | frozenset(targets.TARGETS) | \
        frozenset(backends.BACKENDS)


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
    assert not found, ("target names switched on outside optgen/core/targets.py, "
                       "optgen/compiler/targets/ and runtime/backends/ (ask the registry "
                       "instead):\n" + "\n".join(found))


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
    from optgen.core import targets as core_targets
    from optgen.runtime import backends
    assert target_names() == set(core_targets.FACTS) | set(targets.TARGETS) | \
        set(backends.BACKENDS)
    assert {"llvm", "c", "cuda", "rocm", "opencl", "metal", "webgpu"} <= target_names()
    code = 'if target == "vulkan": pass\nKINDS = ("vulkan", "cuda")'
    assert not switches(code.split("\n")[0])
    monkeypatch.setitem(targets.TARGETS, "vulkan", targets.get("metal"))
    assert len(switches(code)) == 2, switches(code)


# -- one statement of each fact, in the core ------------------------------------------
def _fact_names() -> set[str]:
    """What the core states of a target: its fields, properties and methods."""
    import dataclasses
    from optgen.core.targets import TargetFacts
    return ({f.name for f in dataclasses.fields(TargetFacts)} - {"name"}) | {
        n for n, v in vars(TargetFacts).items()
        if not n.startswith("_") and (isinstance(v, property) or callable(v))}


def test_every_target_and_backend_reads_its_core_facts():
    """Every compiler target has the core's facts, and so has every runtime backend
    (and the source-only one of a target the runtime cannot run): the very record the
    core registered under its name. The core knows no target the compiler cannot build."""
    from optgen.compiler import targets
    from optgen.core import targets as core_targets
    from optgen.runtime import backends
    assert list(targets.TARGETS) == list(core_targets.FACTS)    # (`optgen targets` order)
    assert set(backends.BACKENDS) <= set(core_targets.FACTS)
    for name, facts in core_targets.FACTS.items():
        assert targets.get(name).facts is facts, name
        assert backends.get(name).facts is facts, name
        assert backends.get(name).target == facts.name == name


def test_nothing_restates_the_core_facts():
    """No compiler target or runtime backend states a fact of the core: none is a field
    of Target or Backend, none is defined by a target's or backend's own class, and
    what they show under a fact's name is the core's answer (keys for every arch list,
    files for every manifest)."""
    import dataclasses
    from optgen.compiler import targets
    from optgen.compiler.targets.base import Target
    from optgen.core import targets as core_targets
    from optgen.runtime import backends
    from optgen.runtime.backends.base import Backend
    facts = _fact_names()
    assert {"family", "device", "host", "machine_bound", "device_abi", "needs_tvm",
            "source", "source_key", "takes_arch", "default_archs", "key", "files"} <= facts
    for cls in (Target, Backend):
        assert not facts & {f.name for f in dataclasses.fields(cls)}, cls
    for obj, base in [*((t, Target) for t in targets.TARGETS.values()),
                      *((b, Backend) for b in backends.BACKENDS.values())]:
        for cls in type(obj).__mro__[:type(obj).__mro__.index(base)]:
            assert not facts & set(vars(cls)), (cls, facts & set(vars(cls)))
    manifest = {"sources": {f.source_key: f"kernels.{f.source}"
                            for f in core_targets.FACTS.values()}}
    for name, core in core_targets.FACTS.items():
        tg, backend = targets.get(name), backends.get(name)
        for side, shown in ((tg, facts & set(dir(Target))), (backend, facts & set(dir(Backend)))):
            for n in shown - {"key", "files"}:
                assert getattr(side, n) == getattr(core, n), (name, n)
            if "files" in shown:
                assert side.files(manifest) == core.files(manifest), name
        for archs in ((), ("sm_75",), ("sm_80", "sm_90a")) if core.takes_arch else ((),):
            full = tg.parse_archs(",".join(archs) or None)
            assert tg.key(full) == backend.target_key(full) == core.key(full), (name, archs)


def test_each_backend_hook_fits_its_facts():
    """A backend loads a library through tvm_ffi (``load``) exactly where the core says
    its kernels need TVM's runtime, and launches from the device ABI (``launcher``)
    exactly where the core says the manifest has one; a source-only target has neither."""
    from optgen.core import targets as core_targets
    from optgen.runtime import backends
    for name, backend in backends.BACKENDS.items():
        assert (backend.load is not None) == backend.facts.needs_tvm, name
        assert (backend.launcher is not None) == backend.facts.device_abi, name
    for name in set(core_targets.FACTS) - set(backends.BACKENDS):
        assert backends.get(name).load is None and backends.get(name).launcher is None
    assert backends.get("metal").device == "metal"


def test_the_facts_the_artifact_key_and_checks_read():
    """The artifact key's target text and machine flag, and the files the runtime
    reads, as every artifact built so far records them."""
    from optgen.core import targets as core_targets
    get = core_targets.get
    assert get("cuda").key(()) == "cuda:sm_80,sm_90"
    assert get("cuda").key(("sm_90a",)) == "cuda:sm_90a"
    assert [n for n, f in core_targets.FACTS.items() if f.key(("sm_90",)) == n] == \
        ["llvm", "c", "rocm", "opencl", "metal", "webgpu"]
    assert [n for n, f in core_targets.FACTS.items() if f.machine_bound] == ["llvm"]
    assert [n for n, f in core_targets.FACTS.items() if f.host] == ["llvm", "c"]
    manifest = {"sources": {"opencl": "kernels.cl", "ll": "kernels.ll"}}
    assert get("opencl").files(manifest) == ["kernels.cl"]
    assert get("llvm").files(manifest) == [] and get("cuda").files(manifest) == []
    assert (get("llvm").source, get("llvm").source_key) == ("ll", "ll")
    assert (get("rocm").source, get("rocm").source_key) == ("ll", "rocm")


def test_a_manifest_of_an_unknown_target_is_an_artifact_error(tmp_path):
    from optgen.core import cache
    from optgen.core.manifest import ArtifactError, verify_manifest
    manifest = {"format": cache.FORMAT, "target": "vulkan"}
    with pytest.raises(ArtifactError, match=r"built for target 'vulkan', which this optgen "
                                            r"does not know \(targets: llvm, c, cuda"):
        verify_manifest(str(tmp_path), manifest)


def test_registry_errors():
    from optgen.compiler import targets
    from optgen.core import targets as core_targets
    from optgen.runtime import backends
    with pytest.raises(ValueError, match=r"unknown target 'vulkan'; targets: llvm, c, cuda"):
        targets.get("vulkan")
    with pytest.raises(ValueError, match=r"target 'llvm' is registered twice"):
        targets.register(targets.get("llvm"))
    with pytest.raises(ValueError, match=r"--arch applies to the cuda target only, not 'c'"):
        targets.archs_for(targets.get("c"), "sm_90")
    for get in (core_targets.get, backends.get):
        with pytest.raises(ValueError, match=r"unknown target 'vulkan'; targets: llvm, c"):
            get("vulkan")
    with pytest.raises(ValueError, match=r"TargetFacts 'llvm' is registered twice"):
        core_targets.register(core_targets.get("llvm"))
    with pytest.raises(ValueError, match=r"target 'x': family 'tpu' is not 'cpu' or 'gpu'"):
        core_targets.TargetFacts("x", "tpu", "tpu", "x")
