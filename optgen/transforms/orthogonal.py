"""orthogonalize: Muon-ize a rule's 2-D update (its step replaced by the orthogonal factor
that Newton-Schulz iterations approximate, optgen.blocks.newton_schulz). One kernel per
parameter kind, as Muon: the matrix planner's for 2-D parameters, the base rule's
elementwise kernel for the others."""
from __future__ import annotations

from typing import Any

from optgen.blocks import newton_schulz, newton_schulz_hypers
from optgen.declarations import Spec
from optgen.dsl import maximum, sqrt
from optgen.ir import Expr
from .rewrite import (TransformError, as_spec, check, derive, first_moment, fresh_name,
                      hyper, recipe_of, rule_of, run_base, split_step, whole_tensor)


def orthogonalize(spec: Any) -> Spec:
    """Muon's orthogonalization of the rule's step on 2-D parameters (R x C)::

        w_new = kept - step                            (the base rule; kept = w or w * decay)
        X     = step / max(||step||_F, ns_eps), then ns_steps Newton-Schulz iterations
                A = X X^T;  X = ns_a X + (ns_b A + ns_c A A) X     (R > C: on X^T)
        w_new = kept - lr * sqrt(max(1, R / C)) * X

    Other parameters take the base rule unchanged. The iteration normalizes, so only the
    step's direction counts: orthogonalize(momentum) is Muon (nesterov=False) and
    orthogonalize(nesterov(momentum)) Muon with Nesterov, on 2-D parameters. Accepts a rule
    with a learning rate ``lr`` and a first moment (``beta1``, ``momentum``, ``ema_beta``)
    whose new w is w (or w times a decay factor) minus a step. Adds Muon's ``ns_steps``,
    ``ns_a``, ``ns_b``, ``ns_c``, ``ns_eps`` and the shape flags ``matrix`` (ndim == 2)
    and ``tall`` (R > C). Compiled for the targets matrix rules build for (docs/matrix.md).

    Reference: K. Jordan et al., "Muon: An optimizer for hidden layers in neural
    networks" (2024), kellerjordan.github.io/posts/muon.
    """
    base = as_spec(spec, "orthogonalize")
    whole_tensor(base, "orthogonalize")
    if base.inputs:
        raise TransformError(f"orthogonalize makes a matrix rule, which reads no extra inputs; "
                             f"{base.name} reads {', '.join(base.inputs)}")
    lr = hyper(base, "lr", "orthogonalize", "the orthogonal step is scaled by it")
    first_moment(base, base.trace(_defaults(base)).updates, "orthogonalize")
    new_spec = derive(base, "orthogonalize",
                      f"orthogonalize({recipe_of(base, 'orthogonalize')})",
                      "the 2-D step orthogonalized by Newton-Schulz iterations (Muon)")
    names = {n: fresh_name(new_spec, n, "orthogonalize", what) for n, what in (
        ("ns_steps", "hyperparameter"), ("ns_a", "hyperparameter"),
        ("ns_b", "hyperparameter"), ("ns_c", "hyperparameter"), ("ns_eps", "hyperparameter"),
        ("matrix", "shape flag"), ("tall", "shape flag"))}
    steps, coefficients, eps = newton_schulz_hypers(new_spec, "step", names)
    new_spec.shape_flag(names["matrix"], "ndim == 2", "2-D parameters: the orthogonal step")
    new_spec.shape_flag(names["tall"], "rows > cols", "R > C: iterate on the C x C Gram matrix")

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(base, w, grad, flags)
        if not flags.matrix:
            return new
        kept, step = split_step(base, w, new["w"], "orthogonalize")
        x = newton_schulz(step, flags.tall, coefficients, steps, eps)
        new["w"] = kept - lr * sqrt(maximum(1.0, new_spec.rows / new_spec.cols)) * x
        return new

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def _defaults(spec: Spec) -> dict[str, bool]:
    return ({n: f.default for n, f in spec.flags.items()}
            | {n: True for n in spec.shape_flags} | {n: True for n in spec.name_flags})
