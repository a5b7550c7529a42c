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

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("optgen", "runtime")
REGISTRY = ROOT / "optgen" / "core" / "formats"   # the one package that reads the texts
FORMAT_NAMES = {"q8", "q4", "bf16", "bf16sr"}
TEXT_PREFIXES = ("q8@", "q4@", "q8:", "q4:", "_qmap_", "_qmid_", "_qtab_")
PREFIX_LENGTHS = {2, 3, 6}   # "q8", "q8@", "_qmap_": the slices that decoded format texts
# slices by those lengths that are not of format texts, each with its reason
ALLOWED = {("runtime/device_abi.py", "a[3:]"): "CUDA architecture names ('sm_90a')",
           ("runtime/schedules/kinds.py", "v[:3]"): "the first values of an lr sequence"}


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
TEMPLATE_TESTS = re.compile(
    r'(==|!=|\bin)\s*\(?\s*"(q8|q4|bf16|bf16sr)"'
    r'|\.(startswith|endswith)\(\(?\s*"(_q|q8|q4|bf16|[0-9]"|__absmax)')


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
            "optgen/torch/format.py", "optgen/core/quant.py"} <= names
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
