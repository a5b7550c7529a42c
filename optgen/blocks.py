"""Building blocks shared by many specs, written once and composed.

Each block declares the hyperparameters it needs on the spec and returns a function
that builds the IR for its piece of the update.
"""
from __future__ import annotations

from typing import Callable

from .dsl import Spec, clip
from .ir import Expr

PREPROCESSED = "preprocessed"


def preprocessed(g: Expr) -> Expr:
    """Mark ``g`` as an already preprocessed gradient: a base rule called by a wrapper
    (LARS) then uses it as is instead of rescaling, clipping and decaying it again."""
    g = g if g.tag is None else g * 1.0
    g.tag = PREPROCESSED
    return g


def rescale_and_clip(spec: Spec) -> Callable[[Expr], Expr]:
    """``clip(rescale_grad * grad, -clip_gradient, clip_gradient)`` with the spec's own
    rescale_grad and clip_gradient (declared by ``gradient_preprocessing``)."""
    rescale, bound = spec.hypers["rescale_grad"].node, spec.hypers["clip_gradient"].node
    return lambda grad: clip(grad * rescale, -bound, bound)


def gradient_preprocessing(spec: Spec, *, coupled_weight_decay: bool = True,
                           weight_decay_default: float = 0.0) -> Callable[[Expr, Expr], Expr]:
    """MXNet's gradient preprocessing, fused into the kernel::

        g = clip(rescale_grad * grad, -clip_gradient, clip_gradient) + weight_decay * w

    Clipping is elementwise and only applies when ``clip_gradient`` is set (None = off).
    With ``coupled_weight_decay=False`` the block declares no weight decay: a spec with
    decoupled decay (AdamW, AdamWeightDecay, Lion) declares and applies its own.
    """
    rescale = spec.hyper("rescale_grad", 1.0, "rescale_grad > 0",
                         "multiply the gradient by this first (e.g. 1/batch_size)")
    bound = spec.hyper("clip_gradient", None, "clip_gradient >= 0",
                       "clip the rescaled gradient elementwise to [-c, c]; None disables",
                       optional=True, none_value=float("inf"))
    wd = None
    if coupled_weight_decay:
        wd = spec.hyper("weight_decay", weight_decay_default, "weight_decay >= 0",
                        "L2 penalty: weight_decay * w is added to the clipped gradient")

    spec.preprocessing = "coupled" if coupled_weight_decay else "decoupled"

    def preprocess(w: Expr, grad: Expr) -> Expr:
        if grad.tag == PREPROCESSED:
            return grad
        g = clip(grad * rescale, -bound, bound)
        return g + wd * w if wd is not None else g

    return preprocess


def moments(m: Expr, v: Expr, g: Expr, beta1: Expr, beta2: Expr) -> tuple[Expr, Expr]:
    """Adam's first and second moments of ``g``, the new values of states ``m`` and ``v``::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g

    Written once for the Adam family (adam, adamw, adamweightdecay, lamb, nadam, radam,
    the torch_* Adam forms); the expressions are exactly those the specs wrote, so
    their kernels are unchanged.
    """
    return beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
