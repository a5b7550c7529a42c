"""Transforms that average iterates: schedule-free (Defazio et al.'s interpolation and
averaging in place of the rule's momentum) and lookahead (Zhang et al.'s slow weights).
One kernel, as the base."""
from __future__ import annotations

import dataclasses
from typing import Any

from optgen.compiler.verify import verify
from optgen.declarations import Spec
from optgen.dsl import maximum, minimum, where
from optgen.ir import Expr, const
from .rewrite import (as_spec, check, clipped_gradient, derive, first_moment, fresh_name,
                      hyper, recipe_of, rule_of, run_base, substitute)


def schedule_free(spec: Any) -> Spec:
    """Schedule-free: the rule's first moment is removed (its decay set to 0, so the rule
    steps on g) and replaced by the interpolation and averaging of Defazio et al.; w
    holds y, where the gradient is taken::

        k       = the parameter's steps before this one;  lr_t = lr * min(1, (k+1) / warmup_steps)
        lr_max  = max(lr_max, lr_t);  weight = (k+1)**r * lr_max**weight_lr_power
        ckp1    = weight / (weight_sum + weight)
        d       = y - rule(y)            (the rule without momentum, at lr_t; decay at y)
        y       = (1 - ckp1) * y + ckp1 * z + (beta1 * (1 - ckp1) - 1) * d
        z       = z - d                  (z = y before the first step)

    beta1 (the removed momentum's decay) is the interpolation; where the rule's default
    is 0 (SGD) the new default is 0.9, the authors' SGDScheduleFree's. schedule_free(adamw) is the
    authors' AdamWScheduleFree; optgen.torch.make gives its class train() and eval(). Accepts
    a rule with a learning rate ``lr`` and a first moment (decay ``beta1`` or
    ``momentum``) that reads its gradient through optgen.blocks.

    Reference: A. Defazio et al., "The Road Less Scheduled", NeurIPS 2024
    (arXiv:2405.15682).
    """
    base = as_spec(spec, "schedule_free")
    lr = hyper(base, "lr", "schedule_free", "warm-up and the average's weights read it")
    new_spec = derive(base, "schedule_free", f"schedule_free({recipe_of(base, 'schedule_free')})",
                      "momentum replaced by schedule-free interpolation and averaging "
                      "(arXiv:2405.15682)")
    fresh = {n: fresh_name(new_spec, n, "schedule_free", what) for n, what in (
        ("warmup_steps", "hyperparameter"), ("r", "hyperparameter"),
        ("weight_lr_power", "hyperparameter"), ("z", "state"), ("k", "state"),
        ("lr_max", "state"), ("weight_sum", "state"))}
    warmup = new_spec.hyper(fresh["warmup_steps"], 0, "warmup_steps >= 0",
                            "linear warm-up of the learning rate over this many steps")
    r = new_spec.hyper(fresh["r"], 0.0, "r >= 0", "the average weights step k by k**r")
    power = new_spec.hyper(fresh["weight_lr_power"], 2.0, "weight_lr_power >= 0",
                           "the average weights a step by lr_max**weight_lr_power")
    z = new_spec.state(fresh["z"], 0.0, "the iterate z (w itself before the first step)")
    k = new_spec.state(fresh["k"], 0.0, "steps taken", shape="scalar")
    lr_max = new_spec.state(fresh["lr_max"], -1.0, "largest warmed-up learning rate so far",
                            shape="scalar")
    weight_sum = new_spec.state(fresh["weight_sum"], 0.0, "sum of the average's weights",
                                shape="scalar")
    # the moment's state goes: find it on a trace of the base
    moment, beta = first_moment(base, verify(base)[0].updates, "schedule_free")
    del new_spec.states[moment]
    info = new_spec.hypers[beta.name].info
    if not info.default:   # (no momentum by default, 0 or None: the authors' SGD default)
        new_spec.hypers[beta.name] = dataclasses.replace(
            new_spec.hypers[beta.name], info=dataclasses.replace(info, default=0.9))
    new_spec.schedule_free_beta = beta.name   # (optgen.torch's train() and eval() read it)
    new_spec.require(f"{beta.name} > 0", f"schedule_free: {beta.name} > 0 (eval() divides "
                     "by it)")

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(base, w, grad, flags)
        step = k + 1
        lr_t = lr * minimum(1.0, step / maximum(warmup, 1))
        lr_max_new = maximum(lr_max, lr_t)
        weight = step ** r * lr_max_new ** power
        sum_new = weight_sum + weight
        ckp1 = where(sum_new > 0, weight / sum_new, 0.0)
        names = [n for n in new if n != moment]
        g = clipped_gradient(base, list(new.values()), "schedule_free")
        plain = dict(zip(names, substitute(
            [new[n] for n in names],
            {id(beta): const(0.0), id(base.states[moment].node): g, id(lr): lr_t})))
        d = w - plain.pop("w")
        z_old = where(k > 0, z, w)
        return {**plain, "w": (1 - ckp1) * w + ckp1 * z_old + (beta * (1 - ckp1) - 1) * d,
                "z": z_old - d, "k": step, "lr_max": lr_max_new, "weight_sum": sum_new}

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec


def lookahead(spec: Any) -> Spec:
    """Lookahead: the rule steps fast weights; every ``lookahead_k`` steps the slow
    weights move toward them and the fast weights restart there::

        w = rule(w)                                        (every step)
        every k-th step:  slow = slow + alpha * (w - slow);  w = slow

    slow starts at the parameter. Accepts any rule. Adds the hyperparameters
    ``lookahead_k`` (5) and ``lookahead_alpha`` (0.5) and the states ``slow`` and
    ``lookahead_count`` (steps since the last synchronization, a scalar).

    Reference: M. R. Zhang, J. Lucas, G. Hinton, J. Ba, "Lookahead Optimizer: k steps
    forward, 1 step back", NeurIPS 2019 (arXiv:1907.08610).
    """
    base = as_spec(spec, "lookahead")
    new_spec = derive(base, "lookahead", f"lookahead({recipe_of(base, 'lookahead')})",
                      "slow weights pulled toward the rule's every k steps (arXiv:1907.08610)")
    k = new_spec.hyper(fresh_name(new_spec, "lookahead_k", "lookahead", "hyperparameter"), 5,
                       "lookahead_k >= 1", "synchronize the slow weights every k steps")
    alpha = new_spec.hyper(fresh_name(new_spec, "lookahead_alpha", "lookahead",
                                      "hyperparameter"), 0.5, "0 <= lookahead_alpha <= 1",
                           "the slow weights move this share of the way to the fast ones")
    slow = new_spec.state(fresh_name(new_spec, "slow", "lookahead", "state"), "w",
                          "the slow weights")
    count = new_spec.state(fresh_name(new_spec, "lookahead_count", "lookahead", "state"), 0.0,
                           "steps since the last synchronization", shape="scalar")

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        new = run_base(base, w, grad, flags)
        c = count + 1
        sync = c >= k
        slow_new = where(sync, slow + alpha * (new["w"] - slow), slow)
        return {**new, "w": where(sync, slow_new, new["w"]), "slow": slow_new,
                "lookahead_count": where(sync, 0.0, c)}

    rule_of(new_spec, rule)
    check(new_spec)
    return new_spec
