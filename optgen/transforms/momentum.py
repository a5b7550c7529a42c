"""Transforms of a rule's gradient and momentum: MARS (the variance-reduced gradient),
EMA momentum (the rule fed an average of its gradients), Nesterov (the first moment
looked one step ahead). Each rewrites the base rule's traced update
(optgen.transforms.rewrite.substitute); one kernel, as the base."""
from __future__ import annotations

from typing import Any

from optgen.blocks import CLIPPED
from optgen.declarations import Spec
from optgen.dsl import maximum, norm
from optgen.ir import Expr, walk
from .rewrite import (TransformError, as_spec, check, clipped_gradient, derive, first_moment,
                      fresh_name, recipe_of, rule_of, run_base, substitute, whole_tensor)


def mars(spec: Any) -> Spec:
    """MARS: the rule stepped on the variance-reduced gradient (the authors' approximate
    MARS, mars_type "mars-adamw" with every parameter taking the MARS rule)::

        c         = g + gamma * beta1 / (1 - beta1) * (g - last_grad)
        c         = c / max(||c||, 1)                 (L2 norm of the parameter tensor)
        the rule's update with c in place of g;  last_grad = g

    g is the rescaled, clipped gradient (coupled weight decay, if the rule has it, is
    added after the correction); last_grad starts at 0. Accepts a rule with a first
    moment (decay ``beta1`` or ``momentum``) that reads its gradient through
    optgen.blocks. Adds the hyperparameter ``gamma`` (0.025) and the state ``last_grad``.

    Reference: H. Yuan et al., "MARS: Unleashing the Power of Variance Reduction for
    Training Large Models", arXiv:2411.10438.
    """
    base = as_spec(spec, "mars")
    whole_tensor(base, "mars")
    new_spec = derive(base, "mars", f"mars({recipe_of(base, 'mars')})",
                      "the rule on MARS's variance-reduced gradient (arXiv:2411.10438)")
    gamma = new_spec.hyper(fresh_name(new_spec, "gamma", "mars", "hyperparameter"), 0.025,
                           "gamma >= 0", "strength of MARS's gradient correction")
    last = new_spec.state(fresh_name(new_spec, "last_grad", "mars", "state"), 0.0,
                          "the previous step's gradient")

    def corrected(g: Expr, new: dict) -> tuple[Expr, Expr]:
        _, beta = first_moment(base, new, "mars")
        c = g + gamma * beta / (1 - beta) * (g - last)
        c = c / maximum(norm(c), 1.0)
        c.tag = CLIPPED   # (the gradient the rule steps on: what cautious() compares with)
        return c, g

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        return _fed(base, "mars", w, grad, flags, corrected, "last_grad")

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def ema(spec: Any) -> Spec:
    """EMA momentum: the rule fed an exponential moving average of its gradient::

        ema = ema_beta * ema + (1 - ema_beta) * g      (g: the rescaled, clipped gradient)
        the rule's update with ema in place of g

    ema(sgd) is heavy-ball momentum in the EMA form (dampening = momentum);
    nesterov(ema(rule)) looks it one step ahead. Accepts a rule that reads its gradient
    through optgen.blocks. Adds the hyperparameter ``ema_beta`` (0.9) and the state
    ``ema``.

    Reference: B. T. Polyak, "Some methods of speeding up the convergence of iteration
    methods", 1964; heavyball's exp_avg block.
    """
    base = as_spec(spec, "ema")
    new_spec = derive(base, "ema", f"ema({recipe_of(base, 'ema')})",
                      "the rule fed an exponential moving average of its gradient")
    beta = new_spec.hyper(fresh_name(new_spec, "ema_beta", "ema", "hyperparameter"), 0.9,
                          "0 <= ema_beta < 1", "decay rate of the gradient's average")
    avg = new_spec.state(fresh_name(new_spec, "ema", "ema", "state"), 0.0,
                         "exponential moving average of the gradient")

    def averaged(g: Expr, new: dict) -> tuple[Expr, Expr]:
        m = beta * avg + (1 - beta) * g
        return m, m

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        return _fed(base, "ema", w, grad, flags, averaged, "ema")

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def nesterov(spec: Any) -> Spec:
    """Nesterov momentum: the step reads the first moment advanced once more with the
    same gradient, m_ahead = f(m_new) where m_new = f(m) is the rule's own moment update::

        EMA  m_new = beta1 * m + (1 - beta1) * g  ->  m_ahead = beta1 * m_new + (1 - beta1) * g
        heavy ball  v_new = mu * v + g            ->  v_ahead = mu * v_new + g

    (the second is Sutskever's Nesterov momentum: nesterov(momentum) is momentum with
    use_nesterov). The state keeps m_new. Accepts a rule with a first moment (decay
    ``beta1``, ``momentum`` or ``ema_beta``) that its new w reads.

    Reference: Y. Nesterov, 1983; I. Sutskever et al., ICML 2013; T. Dozat, "Incorporating
    Nesterov Momentum into Adam", ICLR 2016 workshop.
    """
    base = as_spec(spec, "nesterov")
    new_spec = derive(base, "nesterov", f"nesterov({recipe_of(base, 'nesterov')})",
                      "the step reads the first moment advanced once more (Nesterov)")

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(base, w, grad, flags)
        name, _ = first_moment(base, new, "nesterov")
        m_new = new[name]
        if not any(n is m_new for n in walk([new["w"]])):
            raise TransformError(f"nesterov needs a rule whose new w reads its new first "
                                 f"moment {name!r}; {base.name}'s does not")
        ahead = substitute([m_new], {id(base.states[name].node): m_new})[0]
        new["w"] = substitute([new["w"]], {id(m_new): ahead})[0]
        return new

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def _fed(base: Spec, transform: str, w: Expr, grad: Expr, flags: Any, make: Any,
         state: str) -> dict:
    """The base rule's update with its rescaled, clipped gradient g replaced by
    ``make(g, update)``'s first value; its second is the new value of ``state``."""
    new = run_base(base, w, grad, flags)
    names = list(new)
    g = clipped_gradient(base, list(new.values()), transform)
    fed, kept = make(g, new)
    out = dict(zip(names, substitute([new[n] for n in names], {id(g): fed})))
    out[state] = kept
    return out
