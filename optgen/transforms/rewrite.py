"""What every transform shares: the typed error, the new spec built on a base, the base
rule's traced update by state name, and the few IR rewrites the transforms need
(substitute nodes, split the new w into the kept weight and the step, find the
rule's gradient and its first moment).

A transformed spec remembers how it was made (``recipe``: a Python expression over
``base_spec("name")`` and the transforms), so that optgen.transforms.files can write it as
a spec file: the compiler, the cache key and the torch classes take spec files.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from typing import Any, Callable

from optgen.blocks import CLIPPED
from optgen.compiler.loader import load_spec
from optgen.compiler.nonneg import hyper_bounds
from optgen.compiler.verify import flag_combinations, verify
from optgen.core import catalog
from optgen.declarations import Spec
from optgen.dsl import base_spec
from optgen.ir import ARITH, COMPARE, LOGIC, Expr, apply, const, reduce, walk

# the hyperparameters a first moment's decay goes by, in the catalog's specs
MOMENTUM_HYPERS = ("beta1", "momentum", "ema_beta")


class TransformError(ValueError):
    """A transform applied to a rule it does not accept (the message names both, and
    what the transform needs)."""


# -- the base and the new spec ----------------------------------------------------------
def as_spec(spec: Any, transform: str) -> Spec:
    """``spec`` as a Spec (a Spec, a catalog or registered name, or a spec file's path),
    verified, and elementwise: a TransformError for a rule that multiplies matrices or
    refreshes states on the host (their planner and refresh rules are not rewritten)."""
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        spec = load_file(catalog.resolve(text)) if text.endswith(".py") or os.sep in text \
            else base_spec(text)
    elif not isinstance(spec, Spec):
        raise TypeError(f"{transform}: expected a Spec, a catalog name or a spec file, got "
                        f"{type(spec).__name__} {spec!r}")
    if spec.rule is None:
        raise TransformError(f"{transform}: spec {spec.name!r} has no update rule")
    if spec.refresh_rule is not None or spec.statistics or any(tr.matrix for tr in verify(spec)):
        raise TransformError(f"{transform} takes elementwise rules; {spec.name} multiplies "
                             "matrices or refreshes states on the host")
    return spec


def load_file(path: str, digest: str | None = None) -> Spec:
    """The spec of a file (a generated spec file names its base so; ``digest``, the base
    file's hash, is there for the cache key)."""
    return load_spec(path)


def recipe_of(spec: Spec, transform: str) -> str:
    """The Python expression that rebuilds ``spec`` in a generated spec file."""
    recipe = getattr(spec, "recipe", None)
    if recipe is not None:
        return recipe
    path = getattr(spec, "file", None)
    if path is None:
        raise TransformError(f"{transform}: spec {spec.name!r} was not loaded from a file, so "
                             "its transform cannot be built; pass its catalog name or path")
    path = os.path.abspath(path)
    for name, known in catalog.list_specs().items():
        if os.path.abspath(known) == path:
            return f"base_spec({name!r})"
    with open(path, "rb") as f:   # (the digest puts the file's text in the cache key)
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return f"load_file({path!r}, {digest!r})"


def derive(base: Spec, transform: str, recipe: str, doc: str) -> Spec:
    """A new spec with ``base``'s declarations, named ``<transform>_<base>``; the caller
    declares what the transform adds and its update rule."""
    spec = Spec.extend(base, f"{transform}_{base.name}",
                       f"{transform}({base.name}): {doc}\n\n{base.doc}")
    spec.refresh_rule = base.refresh_rule
    spec.recipe = recipe
    spec.transforms = (*getattr(base, "transforms", ()), transform)
    return spec


def fresh_name(spec: Spec, name: str, transform: str, what: str) -> str:
    """``name`` if ``spec`` has no declaration of that name; a TransformError otherwise."""
    taken = {*spec.hypers, *spec.states, *spec.shape_flags, *spec.name_flags, *spec.inputs,
             *spec.statistics, *spec.accepted}
    if name in taken:
        raise TransformError(f"{transform} declares {what} {name!r}, which {spec.name} "
                             f"already has: {transform} does not apply to {spec.name} (twice?)")
    return name


def run_base(base: Spec, w: Expr, grad: Expr, flags: Any) -> dict[str, Expr]:
    """The base rule's update for this trace, keyed by name ("w" and state names)."""
    out = {}
    for key, value in base.rule(w, grad, flags).items():
        if key is w or key == "w":
            out["w"] = const(value)
        elif isinstance(key, Expr) and key.op == "state":
            out[key.name] = const(value)
        elif isinstance(key, str):
            out[key] = const(value)
        else:
            raise TransformError(f"{base.name}'s update returns the key {key!r}")
    return out


def hyper(spec: Spec, name: str, transform: str, why: str) -> Expr:
    """The hyperparameter ``name`` of ``spec``, or a TransformError saying why it is needed."""
    h = spec.hypers.get(name)
    if h is None or h.node is None:
        raise TransformError(f"{transform} needs a rule with a hyperparameter {name!r} ({why}); "
                             f"{spec.name} has none")
    return h.node


# -- rewriting the traced update ---------------------------------------------------------
def substitute(roots: list[Expr], mapping: dict[int, Expr]) -> list[Expr]:
    """``roots`` rebuilt with each node whose id is in ``mapping`` replaced by its value
    (which is not itself rewritten); nodes that do not change are reused."""
    memo = dict(mapping)
    for node in walk(roots, stop=set(mapping)):
        if id(node) in memo:
            continue
        args = tuple(memo.get(id(a), a) for a in node.args)
        memo[id(node)] = node if all(a is b for a, b in zip(args, node.args)) \
            else _rebuild(node, args)
    return [memo[id(r)] for r in roots]


def _rebuild(node: Expr, args: tuple) -> Expr:
    if node.op in ARITH or node.op in COMPARE or node.op in LOGIC or node.op == "where":
        new = apply(node.op, *args)
    elif node.op == "reduce":   # (over all of x's axes: none named, as global_sum and norm)
        whole = node.name == args[0].axes or args[0].mat is not None
        new = reduce(node.value, args[0], None if whole else node.name)
    else:   # matrix nodes keep their shape
        new = Expr(node.op, args, value=node.value, name=node.name, dtype=node.dtype,
                   kind=node.kind, axes=node.axes, loc=node.loc, mat=node.mat)
    new.loc, new.tag = node.loc, node.tag
    return new


def _kept(x: Expr, w: Expr) -> bool:
    """x is w, or w times a per-step scalar (decoupled weight decay)."""
    if x is w:
        return True
    return x.op == "mul" and any(a is w for a in x.args) and \
        all(a is w or a.kind == "scalar" for a in x.args)


def split_step(spec: Spec, w: Expr, w_new: Expr, transform: str) -> tuple[Expr, Expr]:
    """(kept, step) with w_new = kept - step, kept being w or w scaled by a decoupled
    weight decay; a TransformError for a rule whose new w has another form. A decay
    applied after the step, (kept - step) * decay with decay a per-step scalar (LaProp's),
    is kept * decay - step * decay."""
    if w_new.op == "mul":
        a, b = w_new.args
        inner, decay = (a, b) if b.kind == "scalar" else (b, a)
        if decay.kind == "scalar" and inner.op in ("sub", "add"):
            with contextlib.suppress(TransformError):   # (else: the forms below)
                kept, step = split_step(spec, w, inner, transform)
                return kept * decay, step * decay
    if w_new.op == "sub" and _kept(w_new.args[0], w):
        return w_new.args[0], w_new.args[1]
    if w_new.op == "add":
        a, b = w_new.args
        if _kept(a, w):
            return a, -b
        if _kept(b, w):
            return b, -a
    raise TransformError(f"{transform} needs a rule whose new w is w (or w times a decay "
                         f"factor) minus a step; {spec.name}'s new w is {w_new.describe()}")


def sign_of(spec: Spec, step: Expr) -> Expr:
    """An expression with ``step``'s sign wherever step is nonzero, cheaper to compute:
    ``step`` without its tensor divisors that are never negative (``m / (sqrt(v) + eps)``
    has m's sign: a pass that only needs the sign then reads no v). Exact: x / d with
    d >= 0 is x's sign, +-inf or NaN (d = 0), and (x / d) * g > 0 as x * g > 0 there."""
    if step.op == "mul":
        a, b = step.args
        if a.kind == "scalar":
            return a * sign_of(spec, b)
        if b.kind == "scalar":
            return sign_of(spec, a) * b
    if step.op == "div" and step.args[1].kind == "tensor" and \
            _nonneg(spec, step.args[1], {}):
        return sign_of(spec, step.args[0])
    return step


def _nonneg(spec: Spec, e: Expr, memo: dict) -> bool:
    """Whether ``e`` is proven >= 0: the sign analysis of optgen.compiler.nonneg (which
    decides the q8 format's maps), reduced to what a denominator needs."""
    if id(e) not in memo:
        op, a = e.op, e.args
        if op == "const":
            out = e.dtype == "float" and e.value >= 0
        elif op == "hyper":
            h = spec.hypers.get(e.name)
            lo = hyper_bounds(h.info.constraint, e.name)[0] if h is not None else None
            out = lo is not None and lo >= 0 or e.name in ("rows", "cols")
        elif op in ("t", "sqrt", "abs", "exp"):
            out = True
        elif op == "state":
            out = e.name in spec.states and spec.states[e.name].nonneg
        elif op in ("add", "div", "min", "mul"):
            out = all(_nonneg(spec, x, memo) for x in a) or (op == "mul" and a[0] is a[1])
        elif op in ("max", "where"):
            out = any(_nonneg(spec, x, memo) for x in a) if op == "max" else \
                all(_nonneg(spec, x, memo) for x in a[1:])
        elif op == "pow":
            out = _nonneg(spec, a[0], memo)
        else:
            out = False
        memo[id(e)] = out
    return memo[id(e)]


def clipped_gradient(spec: Spec, roots: list[Expr], transform: str) -> Expr:
    """The rescaled, clipped gradient the rule reads (optgen.blocks' preprocessing), or
    the gradient a transform put in its place (MARS's c): the last one in the update,
    which no other reads."""
    found = [n for n in walk(roots) if n.tag == CLIPPED]
    if not found:
        raise TransformError(f"{transform} needs a rule that reads its gradient through "
                             "optgen.blocks (gradient_preprocessing or torch_gradient); "
                             f"{spec.name}'s does not")
    return found[-1]


def first_moment(spec: Spec, new: dict[str, Expr], transform: str) -> tuple[str, Expr]:
    """(state name, decay hyperparameter) of the rule's first moment: the state whose new
    value reads itself and one of MOMENTUM_HYPERS (beta1, momentum, ema_beta)."""
    for hname in MOMENTUM_HYPERS:
        h = spec.hypers.get(hname)
        if h is None or h.node is None:
            continue
        for name, value in new.items():
            st = spec.states.get(name)
            if st is None or st.shape != "param":
                continue
            nodes = list(walk([value]))
            if any(n is h.node for n in nodes) and any(n is st.node for n in nodes):
                return name, h.node
    raise TransformError(f"{transform} needs a rule with a first moment (a state updated "
                         f"from itself and a decay {' / '.join(MOMENTUM_HYPERS)}); "
                         f"{spec.name} has none")


def replace_state(spec: Spec, name: str, new_name: str) -> Expr:
    """Declare state ``new_name`` as a copy of ``name``'s declaration; its node."""
    st = spec.states[name]
    node = Expr("state", name=new_name, kind=st.node.kind, axes=st.node.axes, loc=st.loc,
                mat=st.node.mat)
    spec.states[new_name] = dataclasses.replace(st, name=new_name, node=node)
    return node


def rule_of(spec: Spec, fn: Callable) -> None:
    """Install ``fn`` as ``spec``'s update rule."""
    spec.rule = None
    spec.update(fn)


def check(spec: Spec) -> None:
    """Trace and verify the new rule (every flag combination, as a build does): a rule
    the transform cannot take apart raises its TransformError when the transform is
    applied, not when it is built."""
    for flags in flag_combinations(spec):
        spec.trace(flags)
    verify(spec)


def whole_tensor(spec: Spec, transform: str) -> None:
    """A TransformError for a rule that updates rows lazily: ``transform`` reduces over
    the whole parameter tensor, which a row-sparse kernel does not see."""
    if spec.lazy_update_default:
        raise TransformError(f"{transform} reduces over the whole parameter tensor; "
                             f"{spec.name} updates only the rows a sparse gradient has")
