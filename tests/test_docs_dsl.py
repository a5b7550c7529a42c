"""docs/dsl.md, the DSL reference: every example in it is real, and it names every
construct of optgen.dsl and optgen.blocks.

- A ```python block whose first line is ``# spec: NAME`` is the spec file NAME.py. It is
  loaded and verified as ``optgen build`` does, and stepped by the reference interpreter
  for every flag combination with default and "busy" hyperparameters. The ones in
  COMPILED are also built for llvm and compared with the interpreter (``optgen check``).
- Every other ```python block is a script, run in a folder that holds those spec files;
  a ```text block right after it is its expected output.
- The ``example`` column of the tables headed ``| write | example | meaning |``: each
  example is verified inside a template spec and stepped by the interpreter; the
  reductions are also built together and compared (every elementwise op is compiled
  by the catalog and tests/test_dsl_features.py).
"""
from __future__ import annotations

import ast
import contextlib
import io
import itertools
import re
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pytest

import optgen
from optgen import blocks, dsl
from optgen.commands import check
from optgen.compiler import pipeline, targets
from optgen.compiler.loader import load_spec
from optgen.compiler.variants import variant_name
from optgen.compiler.verify import verify
from optgen.errors import SpecError
from optgen.runtime import Artifact
from optgen.core import scalar_expr, views
from helpers import busy_hypers, default_hypers, valid

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "dsl.md"
TEXT = DOC.read_text(encoding="utf-8")

# spec name -> the base it is built with (wrappers), for the specs built for llvm here.
# Each build takes a few seconds: the scripts in the doc build these same artifacts.
COMPILED = {"heavy_ball": None, "warmup_sgd": None, "momentum_sgd": None,
            "factored_rms": None, "adam_power": None, "svrg_sgd": None,
            "lazy_adagrad": None, "layer_scaled": "nag"}
# wrappers: the catalog bases their reference runs use besides the file's default
WRAPPER_BASES = {"layer_scaled": ["adam", "nag"]}
SHAPES = [(6, 5), (3, 4, 5), (7,), (1,)]


# -- reading the doc --------------------------------------------------------------------
@dataclass
class Block:
    lang: str
    body: str
    line: int              # the line of the opening fence
    output: str | None = None   # a text block right after a script: what it prints


def doc_blocks() -> list[Block]:
    out: list[Block] = []
    fence = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.M | re.S)
    last_end = None
    for match in fence.finditer(TEXT):
        block = Block(match.group(1), match.group(2), TEXT.count("\n", 0, match.start()) + 1)
        prev = out[-1] if out else None
        if block.lang == "text" and prev is not None and prev.lang == "python" \
                and not prev.body.startswith("# spec:") \
                and TEXT[last_end:match.start()].strip() == "":
            prev.output = block.body
        else:
            out.append(block)
        last_end = match.end()
    return out


BLOCKS = doc_blocks()
SPECS = {b.body.splitlines()[0].split(":", 1)[1].strip(): b for b in BLOCKS
         if b.lang == "python" and b.body.startswith("# spec:")}
SCRIPTS = [b for b in BLOCKS if b.lang == "python" and not b.body.startswith("# spec:")]


def table_examples() -> dict[str, list[str]]:
    """Section title -> the backticked examples in the ``example`` column of its tables."""
    examples: dict[str, list[str]] = {}
    section, in_table = "", False
    for line in TEXT.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells[:3] == ["write", "example", "meaning"]:
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and not set(cells[1]) <= set("-"):
            examples.setdefault(section, []).extend(re.findall(r"`([^`]+)`", cells[1]))
    return examples


TABLES = table_examples()
EXAMPLES = [e for examples in TABLES.values() for e in examples]
# the doc's code: fenced blocks and inline `code` spans outside them
CODE = [b.body for b in BLOCKS] + re.findall(
    r"`([^`]+)`", re.sub(r"^```.*?^```[ \t]*$", "", TEXT, flags=re.M | re.S))


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory) -> Path:
    """A folder holding every spec file of the doc, NAME.py."""
    folder = tmp_path_factory.mktemp("dsl_doc")
    for name, block in SPECS.items():
        (folder / f"{name}.py").write_text(block.body, encoding="utf-8")
    return folder


# -- the reference interpreter without a build ------------------------------------------
def reference_artifact(path: Path, base: str | None = None) -> Artifact:
    """An Artifact holding the kernel IR of every (flags, dtype) of a spec, made by the
    pipeline's own load, verify and IR stages without TVM: enough for
    ``backend="reference"``, which never opens the library."""
    spec = load_spec(str(path), base)
    traces = verify(spec)
    tg = targets.get("llvm")
    kernels = [{"symbol": pipeline.symbol_for(spec.name, pdt, kir.flags), "dtype": dt,
                "param_dtype": pdt, **kir.to_json(),
                "variant": variant_name(pdt, kir.flags, spec.flags)}
               for kir, dt, pdt in pipeline.variants(pipeline.kernel_irs(spec, traces, tg),
                                                     tg.dtypes)]
    variants = {}
    for k in kernels:
        v = variants.setdefault(k["variant"], {"param_dtype": k["param_dtype"], "flags": {
            f: k["flags"][f] for f in spec.flags}, "kernels": []})
        v["kernels"].append(k["symbol"])
    manifest = {
        "name": spec.name, "target": "llvm", "key": "reference-only",
        "hyperparameters": [h.info.to_json() for h in spec.hypers.values()],
        "requirements": [r.to_json() for r, _ in spec.requirements],
        "states": [{"name": s.name, "init": s.init, "shape": s.shape, "doc": s.doc,
                    "when": s.when, "half_when": s.half_when} for s in spec.states.values()],
        "kernels": kernels,
        "shape_flags": {n: {"rule": r, "doc": d} for n, (r, d) in spec.shape_flags.items()},
        "name_flags": {n: {"exclude": list(x), "doc": d}
                       for n, (x, d) in spec.name_flags.items()},
        "inputs": spec.inputs, "lazy_update_default": spec.lazy_update_default,
        "statistics": {n: {"shape": shape, "doc": doc}
                       for n, (shape, doc) in spec.statistics.items()},
        "accepted": spec.accepted, "state_format": {},
        "reduction_buffer_size": pipeline.RED_SCALAR_SIZE, "reduction_dtype": tg.acc_dtype,
        "variants": variants, "default_variants": list(variants)[:1],
    }
    return Artifact(str(path.parent), manifest)


def step_reference(art: Artifact, hyper: dict, dtype: str, seed: int = 0) -> optgen.Optimizer:
    """Three reference steps on SHAPES (random parameters, gradients and inputs)."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    opt = optgen.create(art, params, backend="reference", **hyper)
    for _ in range(3):
        grads = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
        extra = {n: [rng.standard_normal(s).astype(dtype) for s in SHAPES] for n in art.inputs}
        assert opt.step(grads, **extra)
    return opt


def param_flags(art: Artifact, hyper: dict, shape: tuple) -> dict[str, bool]:
    """The flags of an unnamed parameter of ``shape``: the user's, its shape flags, and
    its name flags (True without a name)."""
    sizes = views.shape_env(shape)
    return {**{n: hyper[n] for n in art.flags},
            **{n: bool(scalar_expr.evaluate(r, sizes)) for n, r in art.shape_flags.items()},
            **{n: True for n in art.name_flags}}


def settings(art: Artifact):
    """(label, hyperparameters) for every flag combination, default and busy, that the
    spec's requirements allow."""
    names = list(art.flags)
    for bits in itertools.product([False, True], repeat=len(names)):
        flags = dict(zip(names, bits))
        for label, make in (("default", default_hypers), ("busy", busy_hypers)):
            hyper = make(art, flags)
            if valid(art, hyper):
                yield f"{label} {flags}", hyper


# -- the doc's structure ----------------------------------------------------------------
def test_doc_has_the_examples_the_tests_expect():
    assert len(SPECS) == sum(b.body.startswith("# spec:") for b in BLOCKS), "duplicate spec name"
    assert set(COMPILED) <= set(SPECS), set(COMPILED) - set(SPECS)
    assert set(WRAPPER_BASES) <= set(SPECS)
    assert set(TABLES) == {"Expressions", "Reductions and passes"}, TABLES
    assert len(TABLES["Expressions"]) >= 15 and len(TABLES["Reductions and passes"]) >= 6
    assert all(b.lang in ("python", "text") for b in BLOCKS), \
        [(b.line, b.lang) for b in BLOCKS if b.lang not in ("python", "text")]
    stray = [b.line for b in BLOCKS if b.lang == "text"]
    assert not stray, f"text blocks not right after a script, at lines {stray}"


def _public_names(module) -> list[str]:
    """Names a module defines at top level (def, class, assignment), not starting with _."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return [n for n in names if not n.startswith("_")]


def _spec_members() -> list[str]:
    members = [f.name for f in fields(dsl.Spec)] + ["t"]
    members += [n for n, v in vars(dsl.Spec).items() if not n.startswith("_")
                and (callable(v) or isinstance(v, (property, classmethod)))]
    return members


@pytest.mark.parametrize("name", sorted(set(_public_names(dsl) + _public_names(blocks)
                                            + _spec_members())))
def test_every_public_name_is_documented(name):
    """optgen.dsl's and optgen.blocks' names, and Spec's attributes, appear in code."""
    assert any(re.search(rf"\b{re.escape(name)}\b", code) for code in CODE), \
        f"docs/dsl.md does not mention {name!r} in code"


def test_the_public_name_lists_are_complete():
    """The lists above see what a spec uses (guards _public_names itself)."""
    names = _public_names(dsl)
    assert {"Spec", "sqrt", "where", "clip", "row_mean", "base_spec", "RESERVED"} <= set(names)
    assert {"gradient_preprocessing", "rescale_and_clip", "preprocessed",
            "PREPROCESSED"} <= set(_public_names(blocks))
    assert {"hyper", "flag", "state", "input", "require", "update", "extend", "shape_flag",
            "name_flag", "lazy_update_default"} <= set(_spec_members())


# -- full spec examples -----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPECS))
def test_spec_example_loads_and_verifies(spec_dir, name):
    spec = load_spec(str(spec_dir / f"{name}.py"))
    assert verify(spec)
    assert spec.name == name or spec.base is not None and spec.name.startswith(name + "_")
    assert spec.doc.strip() and spec.reference


@pytest.mark.parametrize("name,base", [(n, b) for n in sorted(SPECS)
                                       for b in [None, *WRAPPER_BASES.get(n, [])]])
def test_spec_example_runs_in_the_reference_interpreter(spec_dir, name, base):
    art = reference_artifact(spec_dir / f"{name}.py", base)
    for label, hyper in settings(art):
        for dtype in ("float32", "float64"):
            opt = step_reference(art, hyper, dtype)
            for i, p in enumerate(opt.params):
                assert p.dtype == dtype and np.isfinite(p).all(), (label, dtype, i)
                for sname, value in opt.state[i].items():
                    assert np.isfinite(value).all(), (label, dtype, i, sname)
                    info = next(s for s in art.states if s.name == sname)
                    want = () if info.shape == "scalar" else views.state_shape(p.shape, info.shape)
                    assert np.shape(value) == want, (label, sname, p.shape)
                    half = info.half_when is not None and \
                        scalar_expr.evaluate(info.half_when, param_flags(art, hyper, p.shape))
                    assert np.asarray(value).dtype == ("float64" if info.shape == "scalar"
                                                       else "float16" if half else dtype), \
                        (label, sname)


def _kernel_irs(art: Artifact) -> list:
    """What the reference interpreter reads of each kernel (a build also names each
    launch's functions, per tensor, segmented and multi-tensor: left out)."""
    return [(k.symbol, k.ir, k.host_scalars, k.scalar_state_updates, k.buffers,
             [{n: v for n, v in ln.items() if n not in ("symbol", "seg_symbol", "mt_symbol")}
              for ln in k.launches])
            for k in art.kernels]


@pytest.mark.parametrize("name", sorted(COMPILED))
def test_compiled_spec_example_matches_the_reference(spec_dir, name):
    path = spec_dir / f"{name}.py"
    art = optgen.get_artifact(str(path), base=COMPILED[name])
    # the reference artifact of the other tests is the built one's IR, kernel for kernel
    assert _kernel_irs(reference_artifact(path, COMPILED[name])) == _kernel_irs(art)
    bad = [r for r in check(art) if not r.ok]
    assert not bad, bad


def test_lazy_example_matches_the_reference_on_row_sparse_gradients(spec_dir):
    art = optgen.get_artifact(str(spec_dir / "lazy_adagrad.py"))
    rng = np.random.default_rng(3)
    for update_slots, dtype in itertools.product([False, True], ["float32", "float64"]):
        w0 = rng.standard_normal((9, 4)).astype(dtype)
        twins = [optgen.create(art, [w0.copy()], backend=b, update_slots=update_slots)
                 for b in ("compiled", "reference")]
        for _ in range(3):
            g = optgen.RowSparse([1, 7, 1, 4], rng.standard_normal((4, 4)).astype(dtype))
            for opt in twins:
                opt.step([g])
        (wc,), (wr,) = (o.params for o in twins)
        np.testing.assert_allclose(wc, wr, rtol=1e-6 if dtype == "float32" else 1e-14)
        untouched = [0, 2, 3, 5, 6, 8]
        assert np.array_equal(wc[untouched], w0[untouched])


def test_mixed_precision_example_matches_the_reference(spec_dir):
    art = optgen.get_artifact(str(spec_dir / "heavy_ball.py"))
    rng = np.random.default_rng(4)
    w0 = rng.standard_normal(1000).astype(np.float16)
    twins = [optgen.create(art, [w0.copy()], backend=b, multi_precision=True, lr=0.05)
             for b in ("compiled", "reference")]
    for _ in range(3):
        g = rng.standard_normal(1000).astype(np.float16)
        for opt in twins:
            opt.step([g.copy()])
    (wc,), (wr,) = (o.params for o in twins)
    assert wc.dtype == np.float16
    np.testing.assert_allclose(wc.astype(np.float32), wr.astype(np.float32), rtol=1e-3)
    np.testing.assert_allclose(twins[0].state[0]["master"], twins[1].state[0]["master"],
                               rtol=1e-6, atol=1e-7)


# -- scripts ------------------------------------------------------------------------------
@pytest.mark.parametrize("block", SCRIPTS, ids=[f"line{b.line}" for b in SCRIPTS])
def test_script_example_runs(spec_dir, monkeypatch, block):
    monkeypatch.chdir(spec_dir)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.body, f"docs/dsl.md:{block.line}", "exec"), {"__name__": "__doc__"})
    if block.output is not None:
        assert out.getvalue().rstrip().splitlines() == block.output.rstrip().splitlines()
    else:
        assert out.getvalue() == ""


# -- expression tables --------------------------------------------------------------------
TEMPLATE = '''\
"""The expression examples of docs/dsl.md, in one update (tests/test_docs_dsl.py)."""
from optgen.dsl import (Spec, clip, col_mean, eq, exp, global_sum, log, maximum, mean, minimum, ne,
                        norm, rms, row_mean, rsqrt, sign, sqrt, sum, where, atan, atan2, clamp,
                        copysign, cosh, erf, expm1, log1p, pow, sinh, tanh, head_mean,
                        head_sum, round_bf16, lerp)

spec = Spec("{name}", __doc__, reference="docs/dsl.md")
lr = spec.hyper("lr", 0.01, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "first-moment decay")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "second-moment decay")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to v")
heads = spec.hyper("heads", 1, "heads >= 1", "groups of rows", type="int")
m = spec.state("m", 0.0, "first moment")
v = spec.state("v", 0.0, "second moment")
t = spec.t


def number(x):
    return where(x, 1.0, 0.0) if x.dtype == "bool" else x


@spec.update
def rule(w, grad, flags):
    d = 0.0
{lines}
    return {{m: beta1 * m + (1 - beta1) * grad, v: beta2 * v + (1 - beta2) * grad * grad,
             w: w - lr * d}}
'''


def template(name: str, examples: list[str]) -> str:
    lines = "\n".join(f"    d = d + number({e})" for e in examples)
    return TEMPLATE.format(name=name, lines=lines)


@pytest.mark.parametrize("example", EXAMPLES)
def test_expression_example_verifies_and_runs(tmp_path, example):
    path = tmp_path / "one.py"
    path.write_text(template("one", [example]), encoding="utf-8")
    art = reference_artifact(path)
    opt = step_reference(art, default_hypers(art, {}), "float64")
    assert all(np.isfinite(p).all() for p in opt.params), example


def test_reduction_examples_compiled_match_the_reference(tmp_path):
    path = tmp_path / "reductions.py"
    path.write_text(template("reductions", TABLES["Reductions and passes"]), encoding="utf-8")
    bad = [r for r in check(optgen.get_artifact(str(path))) if not r.ok]
    assert not bad, bad


# -- verifier rules that docs/dsl.md lists and tests/test_spec_errors.py does not hold ----
BROKEN = """\
from optgen.dsl import Spec, mean, where
spec = Spec("broken", "a spec the verifier rejects", reference="docs/dsl.md")
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
{decl}


@spec.update
def broken(w, grad, flags):
    return {{{ret}}}
"""
RULE_LINE = 9   # the return line (decl is one line)

# (id, declarations (one line), returned dict, message regex, line, hint regex)
REJECTED = [
    # a reduction is a kernel value too: the hint once said "reduce the tensor first"
    ("scalar-state-from-reduction", 's = spec.state("s", 0.0, shape="scalar")',
     "s: mean(grad), w: w", r"scalar state 's' is computed from tensor values", RULE_LINE,
     r"^(?!.*reduce the tensor).*a reduction \(mean, sum\) is computed in the kernel"),
    ("chained-comparison", "", "w: where(0 < grad < 1, w, 0.0)",
     r"only known when the kernel runs", RULE_LINE, r"where\(cond, a, b\)"),
    # located at the `not`, not at the function where grad was made (it once was)
    ("not-on-a-value", "", "w: where(not grad, w, 0.0)",
     r"only known when the kernel runs", RULE_LINE, r"where\(cond, a, b\)"),
    # == on a number was the constant False in the kernel, silently
    ("equals-a-number", "", "w: where(grad == 0.0, w, w - lr * grad)",
     r"'==' on grad 'grad' and 0\.0 compares IR objects", RULE_LINE, r"eq\(a, b\)"),
    ("number-not-equal", "", "w: where(0 != grad, w, w - lr * grad)",
     r"'!=' on grad 'grad' and 0 compares IR objects", RULE_LINE, r"ne\(a, b\)"),
    ("reduce-a-bool", "", "w: w - lr * mean(grad > 0)",
     r"mean\(\) needs a float operand", RULE_LINE, r"where\(cond, 1\.0, 0\.0\)"),
    ("half-scalar-state", 'f = spec.flag("f"); s = spec.state("s", 0.0, shape="scalar", '
     'half_when="f")', "s: s, w: w", r"scalar states stay float64", 4, r"drop half_when"),
    ("name-flag-exclude-string", 'spec.name_flag("scaled", "bias")', "w: w",
     r"exclude must be a tuple of strings", 4, r"exclude=\('bias', 'norm'\)"),
    # located at the read, not at the state's declaration (it once was)
    ("state-read-where-absent", 'f = spec.flag("f"); m = spec.state("m", 0.0, when="f")',
     "w: w - lr * m", r"state 'm' is read \(flags \{'f': False\}\) but does not exist",
     RULE_LINE, r"under its when= flags"),
    ("state-written-where-absent", 'f = spec.flag("f"); m = spec.state("m", 0.0, when="f")',
     "m: 2 * grad, w: w", r"state 'm' is updated \(flags \{'f': False\}\) but does not exist",
     RULE_LINE, r"under its when= flags"),
    ("input-in-a-lazy-spec", 'x = spec.input("x"); spec.lazy_update_default = True',
     "w: w - lr * x", r"lazy_update_default is set, but the update reads extra inputs", 2,
     r"drop lazy_update_default"),
    ("spec-name-not-identifier", 'other = Spec("my-spec")', "w: w",
     r"spec name 'my-spec' must be a Python identifier", 4, r"letters, digits"),
    ("requirement-bad-syntax", 'spec.require("lr <", "broken")', "w: w",
     r"bad constraint: cannot parse 'lr <'", 4, r"comparison over hyperparameters"),
]


@pytest.mark.parametrize("decl,ret,message,line,hint", [c[1:] for c in REJECTED],
                         ids=[c[0] for c in REJECTED])
def test_rejected_specs(tmp_path, decl, ret, message, line, hint):
    path = tmp_path / "broken.py"
    path.write_text(BROKEN.format(decl=decl, ret=ret), encoding="utf-8")
    with pytest.raises(SpecError, match=message) as err:
        verify(load_spec(str(path)))
    assert (err.value.file, err.value.line) == (str(path), line), str(err.value)
    assert re.search(hint, err.value.hint), err.value.hint


def test_an_unset_optional_hyperparameter(spec_dir):
    """None is its none_value in the kernel (warmup_sgd's cap: inf, no bound) and NaN in a
    rule that names it, so comparisons with it are false."""
    art = reference_artifact(spec_dir / "warmup_sgd.py")
    w = np.zeros(3)
    opt = optgen.create(art, [w], backend="reference", cap=None, lr=0.5, warmup=1)
    opt.step([np.array([-1e30, 2.0, np.nan])])
    np.testing.assert_array_equal(w, [5e29, -1.0, np.nan])
    assert not scalar_expr.evaluate("cap > 0", {"cap": None})
    assert scalar_expr.evaluate("not (cap > 0)", {"cap": None})
