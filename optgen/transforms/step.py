"""Transforms of a rule's step: cautious (C-AdamW's mask), trust ratio (LAMB's layer-wise
scale) and grafting (one rule's direction at another's norm). Each traces the base rule,
takes its new w apart (optgen.transforms.rewrite.split_step) and writes a new one; the
base's states are updated as before. One kernel, as the base."""
from __future__ import annotations

from typing import Any

from optgen.declarations import Spec
from optgen.dsl import maximum, mean, norm, where
from optgen.ir import Expr
from .rewrite import (TransformError, as_spec, check, clipped_gradient, derive, fresh_name, hyper,
                      recipe_of, replace_state, rule_of, run_base, sign_of, split_step,
                      substitute, whole_tensor)


def cautious(spec: Any) -> Spec:
    """C-AdamW's caution: the step is kept only where it agrees in sign with the gradient,
    and rescaled by the share of elements kept::

        w_new = kept - step                      (the base rule; kept = w or w * decay)
        phi   = 1 where step * g > 0, else 0     (g: the rescaled, clipped gradient)
        w_new = kept - step * phi / max(mean(phi), 1e-3)

    The mean is over the whole parameter tensor; decoupled weight decay (``kept``) is not
    masked. Accepts a rule whose new w is w (or w times a decay factor) minus a step and
    that reads its gradient through optgen.blocks.

    Reference: K. Liang, L. Chen, B. Liu, Q. Liu, "Cautious Optimizers", arXiv:2411.16085.
    """
    base = as_spec(spec, "cautious")
    whole_tensor(base, "cautious")
    new_spec = derive(base, "cautious", f"cautious({recipe_of(base, 'cautious')})",
                      "the step is kept where it agrees in sign with the gradient, "
                      "rescaled by the share kept (arXiv:2411.16085)")

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(base, w, grad, flags)
        kept, step = split_step(base, w, new["w"], "cautious")
        g = clipped_gradient(base, list(new.values()), "cautious")
        agree = where(sign_of(base, step) * g > 0, 1.0, 0.0)   # (step's sign, cheaper)
        new["w"] = kept - step * (agree / maximum(mean(agree), 1e-3))
        return new

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def trust_ratio(spec: Any) -> Spec:
    """LAMB's layer-wise trust ratio on the rule's whole step d = w - w_new (weight decay
    included), with u = d / lr the step before the learning rate::

        ratio = ||w|| / ||u||   if ||w|| > 0 and ||u|| > 0, else 1
        w_new = w - lr * ratio * u

    (norms over the whole parameter tensor, w before the update). trust_ratio(adamw) is
    LAMB with bias correction. Accepts a rule with a hyperparameter ``lr`` that scales
    its step.

    Reference: Y. You et al., "Large Batch Optimization for Deep Learning: Training BERT
    in 76 minutes", ICLR 2020 (arXiv:1904.00962).
    """
    base = as_spec(spec, "trust_ratio")
    whole_tensor(base, "trust_ratio")
    lr = hyper(base, "lr", "trust_ratio", "the ratio scales the step before the learning rate")
    new_spec = derive(base, "trust_ratio", f"trust_ratio({recipe_of(base, 'trust_ratio')})",
                      "the step scaled by LAMB's trust ratio ||w|| / ||step / lr||")

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(base, w, grad, flags)
        d = w - new["w"]
        n_w, n_d = norm(w), norm(d)
        ratio = where((n_w > 0) & (n_d > 0), lr * n_w / n_d, 1.0)
        new["w"] = w - ratio * d
        return new

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def graft(direction: Any, magnitude: Any) -> Spec:
    """Layer-wise grafting: ``direction``'s step at ``magnitude``'s norm, both rules run
    in one kernel on the same gradient::

        d_D = w - D(w)       d_M = w - M(w)       (each rule's whole step)
        w_new = w - ||d_M|| / ||d_D|| * d_D       (0 where ||d_D|| = 0)

    Hyperparameters and flags of one name are shared (``lr`` scales both); the
    magnitude rule's states whose names the direction rule uses too are renamed
    ``graft_<name>``. Accepts any two elementwise rules.

    Reference: N. Agarwal, R. Anil, E. Hazan, T. Koren, C. Zhang, "Disentangling Adaptive
    Gradient Methods from Learning Rates", arXiv:2002.11803.
    """
    dspec, mspec = as_spec(direction, "graft"), as_spec(magnitude, "graft")
    whole_tensor(dspec, "graft")
    whole_tensor(mspec, "graft")
    recipe = f"graft({recipe_of(dspec, 'graft')}, {recipe_of(mspec, 'graft')})"
    new_spec = derive(dspec, "graft", recipe, f"{dspec.name}'s step at {mspec.name}'s norm "
                      "(layer-wise grafting, arXiv:2002.11803)")
    new_spec.name = f"graft_{dspec.name}_{mspec.name}"
    renamed: dict[int, Expr] = {}
    for name, h in mspec.hypers.items():
        new_spec.hypers.setdefault(name, h)
    for name, st in mspec.states.items():
        if name in dspec.states:
            new_name = fresh_name(new_spec, f"graft_{name}", "graft", "state")
            new_spec.states[name] = st   # (for replace_state; restored below)
            renamed[id(st.node)] = replace_state(new_spec, name, new_name)
            new_spec.states[name] = dspec.states[name]
        else:
            new_spec.states[name] = st
    for mine, theirs in ((new_spec.shape_flags, mspec.shape_flags),
                         (new_spec.name_flags, mspec.name_flags),
                         (new_spec.inputs, mspec.inputs), (new_spec.accepted, mspec.accepted)):
        mine.update({k: v for k, v in theirs.items() if k not in mine})
    new_spec.requirements += mspec.requirements
    mine = {n: node for n, node in ((n, mspec.hypers[n].node) for n in mspec.hypers)
            if node is not None and n in dspec.hypers and dspec.hypers[n].node is not None}
    shared = {id(node): dspec.hypers[n].node for n, node in mine.items()
              if node is not dspec.hypers[n].node}

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(dspec, w, grad, flags)
        other = run_base(mspec, w, grad, flags)
        names = list(other)
        values = substitute([other[n] for n in names], {**renamed, **shared})
        for n, v in zip(names, values):
            if n != "w":
                new["graft_" + n if n in dspec.states else n] = v
        d_d, d_m = w - new["w"], w - dict(zip(names, values))["w"]
        n_d = norm(d_d)
        new["w"] = w - where(n_d > 0, norm(d_m) / n_d, 0.0) * d_d
        return new

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec
