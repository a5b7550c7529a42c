"""State formats are decoded in one place (issue 32): outside the format registry
(optgen/core/formats/), no module of optgen/ or runtime/ slices a format text by a
format prefix's length ("q8"[:2], "q8@64"[3:], "_qmap_signed"[6:]), compares a value
with a format name ("q8", "q4", "bf16", "bf16sr", "q8@...", "q8:..."), or tests a
buffer name for a format's table prefix: each asks the registry's ``Format`` instead.
The checker runs over the tree (ast) and, so that it is known to fail, over lines
taken from the code before the registry.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from optgen.core.formats import registry

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("optgen", "runtime")
REGISTRY = ROOT / "optgen" / "core" / "formats"   # the one package that reads the texts


def registered_texts() -> tuple[frozenset[str], tuple[str, ...]]:
    """The names of every registered format and the prefixes of the texts the registry
    prints for them: requests with a block ("q8@", "fp8@"), stored texts ("q8:",
    "fp8:") and table buffer names without their map ("_qmap_"), read from the
    registry's own output (a family registered later is scanned for with no change here)."""
    names, prefixes = set(), set()
    for family in registry.FAMILIES:
        for name in family.names:
            names.add(name)
            fmt = registry.of(name)
            texts = [str(fmt), fmt.stored]
            for m in (m for m, owner in family.maps.items() if owner == name):
                mapped = fmt.with_map(m)
                other = registry.Format(name, family, fmt.dtype, 2 * mapped.block, m)
                texts += [str(other), mapped.stored, other.stored]
                prefixes.update(t[:-len(m)] for t in mapped.tables() if t.endswith(m))
            prefixes.update(t[:len(name) + 1] for t in texts
                            if t.startswith(name) and len(t) > len(name))
    return frozenset(names), tuple(sorted(prefixes))


FORMAT_NAMES, TEXT_PREFIXES = registered_texts()
# the slices that decode a format text: by a name's or a prefix's length ("q8"[:2],
# "q8@64"[3:], "_qmap_signed"[6:], "fp8@64"[4:])
PREFIX_LENGTHS = {len(t) for t in (*FORMAT_NAMES, *TEXT_PREFIXES)}
# slices by those lengths that are not of format texts, each with its reason
ALLOWED = {("runtime/device_abi.py", "a[3:]"): "CUDA architecture names ('sm_90a')",
           ("runtime/schedules/kinds.py", "v[:3]"): "the first values of an lr sequence",
           ("optgen/compiler/targets/rocm.py", "data[:4]"): "an ELF file's magic bytes",
           ("optgen/compiler/pipeline.py", "names[:3]"): "the first variant names of a "
                                                       "progress line"}


def _format_literal(node: ast.AST) -> bool:
    """A format name or a text a format prefix starts, alone or in a tuple/list/set."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_format_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and (
        node.value in FORMAT_NAMES or node.value.startswith(TEXT_PREFIXES))


def _const_bound(s: ast.Slice) -> bool:
    bounds = [b for b in (s.lower, s.upper) if b is not None]
    return s.step is None and len(bounds) == 1 and isinstance(bounds[0], ast.Constant) \
        and bounds[0].value in PREFIX_LENGTHS


def violations(source: str, path: str = "<snippet>") -> list[str]:
    """``path:line: what`` for each format text read outside the registry."""
    out = []
    for node in ast.walk(ast.parse(source)):
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) \
                and _const_bound(node.slice) and not isinstance(node.value, ast.Call) \
                and (path, ast.unparse(node)) not in ALLOWED:
            out.append(f"{where}: slices {ast.unparse(node)} (a format text? ask the "
                       "registry's Format)")
        elif isinstance(node, ast.Compare) and any(
                _format_literal(x) for x in [node.left, *node.comparators]):
            out.append(f"{where}: compares with a format name: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith") \
                and any(_format_literal(a) for a in node.args):
            out.append(f"{where}: tests a format prefix: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and any(
                k is not None and _format_literal(k) for k in node.keys):
            out.append(f"{where}: a table keyed by format names: {ast.unparse(node)[:60]}")
    return out


def _modules() -> list[Path]:
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    return [p for p in files if REGISTRY not in p.parents and "__pycache__" not in p.parts]


def test_no_format_text_is_read_outside_the_registry():
    found = [v for p in _modules()
             for v in violations(p.read_text(encoding="utf-8"),
                                 str(p.relative_to(ROOT)))]
    assert not found, "format texts decoded outside optgen/core/formats/:\n    " + \
        "\n    ".join(found)


# the templates ask the kernel (k.blocked, k.tables, k.companions, k.packed: the
# registry's FormattedKernel) rather than testing names: no comparison with a format
# name and no prefix/suffix test of a buffer name against a format's
_NAMES = "|".join(map(re.escape, sorted(FORMAT_NAMES, key=len, reverse=True)))
TEMPLATE_TESTS = re.compile(
    rf'(==|!=|\bin)\s*\(?\s*"({_NAMES})"'
    rf'|\.(startswith|endswith)\(\(?\s*"(_q|{_NAMES}|[0-9]"|__absmax)')


def test_no_template_tests_a_format_name():
    found = [f"{p.name}:{n}: {line.strip()}"
             for p in sorted((ROOT / "templates").glob("*.j2"))
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if TEMPLATE_TESTS.search(line)]
    assert not found, "templates testing format names:\n    " + "\n    ".join(found)


@pytest.mark.parametrize("line", [   # templates/_buffers.j2 before the registry
    '{%- elif k.view == "q8" %}',
    '{%- elif k.view == "q8" and b.name.startswith(("_qtab_", "_qmid_")) %}',
    '{%- elif k.view == "q8" and k.quant.get(b.name, "").endswith("4") %}',
    '{%- elif b.name.endswith("__absmax") %}',
])
def test_the_template_checker_flags_the_templates_before_the_registry(line):
    assert TEMPLATE_TESTS.search(line)


def test_the_registry_is_scanned_around_not_missed():
    """The exclusion is the registry package alone: the scan sees the consumers."""
    names = {str(p.relative_to(ROOT)) for p in _modules()}
    assert {"optgen/compiler/lower.py", "runtime/launch.py", "runtime/checkpoint.py",
            "optgen/torch/torch_checkpoints.py", "optgen/core/quant.py"} <= names
    assert not any(n.startswith("optgen/core/formats/") for n in names)


# lines of the code before the registry (commit 4da967e), each read a format's text (on
# that tree the checker reports 28 places in 12 modules)
BEFORE = [
    ("optgen/core/formats.py", "return [n for n, f in fmt.items() if f[:2] in QUANT]"),
    ("optgen/core/formats.py", "q, size = fmt[:2], fmt[3:]"),
    ("optgen/core/formats.py", "return [n for n, f in fmt.items() if f == 'bf16sr' and n != PARAM]"),
    ("optgen/core/formats.py", "QUANT = {'q8': 256, 'q4': 128}"),
    ("optgen/compiler/variants.py", "q = sorted({fmt[n][:2] for n in formats.quantized(fmt)})"),
    ("optgen/compiler/specialize.py", "bad = [n for n in ln.outputs if ln.view not in ('flat', 'q8')]"),
    ("optgen/core/quant.py", "ok = text.startswith(('q8:', 'q4:'))"),   # (is_stored, unrolled)
    ("optgen/core/quant.py", "TABLES = {'_qmap_': dynamic_map, '_qmid_': bucket_midpoints}"),
    ("optgen/compiler/lower.py", "t = name.startswith(('_qmap_', '_qmid_', '_qtab_'))"),
    ("runtime/launch.py", "host = quant.TABLES[name[:6]](name[6:])"),
    ("runtime/checkpoint.py", "converted.add(f'{kind[:2]} -> {want}')"),
    ("runtime/shards.py", "flat = launch['view'] in ('flat', 'q8')"),
]


def test_the_names_come_from_the_registry_fp8_included():
    """Every registered family is scanned for: fp8's texts as much as q8's."""
    assert {"q8", "q4", "bf16", "bf16sr", "fp8"} <= FORMAT_NAMES
    assert {"q8@", "q4@", "fp8@", "q8:", "q4:", "fp8:", "_qmap_", "_qmid_",
            "_qtab_"} <= set(TEXT_PREFIXES)
    assert FORMAT_NAMES == {n for f in registry.FAMILIES for n in f.names}


@pytest.mark.parametrize("path,line", [   # fp8 read as q8 was before the registry
    ("runtime/checkpoint.py", "if kind == 'fp8': pass"),
    ("optgen/compiler/lower.py", "scaled = fmt in ('q8', 'fp8')"),
    ("runtime/launch.py", "block = int(text[4:]) if text.startswith('fp8@') else 256"),
    ("optgen/torch/torch_checkpoints.py", "e4m3 = stored.startswith('fp8:')"),
    ("optgen/core/quant.py", "BITS = {'fp8': 8}"),
])
def test_the_checker_flags_fp8_texts(path, line):
    assert violations(line, path), f"not flagged: {line}"


def test_the_template_checker_flags_fp8():
    assert TEMPLATE_TESTS.search('{%- elif k.view == "fp8" %}')
    assert TEMPLATE_TESTS.search('{%- if b.name.startswith("fp8") %}')


@pytest.mark.parametrize("path,line", BEFORE)
def test_the_checker_flags_the_code_before_the_registry(path, line):
    assert violations(line, path), f"not flagged: {line}"


@pytest.mark.parametrize("line", [
    "pairs = list(meshes.values())[:2]",            # a list built there, not a text
    "fmt = formats.of(text); blocked = fmt.blocked",
    "dtype = 'bfloat16' if low else 'float32'",     # a dtype, not a format
    "rest = args[1:]",
])
def test_the_checker_passes_code_that_asks_the_registry(line):
    assert not violations(line, "runtime/x.py")
