"""Building blocks shared by many specs, written once and composed.

Each block declares the hyperparameters it needs on the spec and returns a function
that builds the IR for its piece of the update.
"""
from __future__ import annotations

from typing import Any, Callable

from .dsl import Spec, clip, matmul, maximum, norm, repeat, round_bf16, sqrt
from .ir import Expr

PREPROCESSED = "preprocessed"
CLIPPED = "clipped"   # the rescaled, clipped gradient: what optgen.transforms rewrite


def preprocessed(g: Expr) -> Expr:
    """Mark ``g`` as an already preprocessed gradient: a base rule called by a wrapper
    (LARS) then uses it as is instead of rescaling, clipping and decaying it again."""
    g = g if g.tag in (None, CLIPPED) else g * 1.0
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
        g.tag = CLIPPED
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


def torch_gradient(spec: Spec, *, weight_decay_default: float | None = 0.0,
                   decoupled: bool | None = False
                   ) -> tuple[Callable[[Expr, Expr, Any], Expr], Callable[[Expr, Any], Expr]]:
    """torch.optim's gradient and weight decay, for the ``torch_*`` specs.

    Declares ``rescale_grad`` and ``clip_gradient`` (``gradient_preprocessing``, default
    off, so the runtime's loss_scale and clip_global_norm work), ``weight_decay``, the
    flag ``maximize`` and, with ``decoupled=None``, the flag ``decoupled_weight_decay``.
    ``weight_decay_default=None``: no weight decay at all (torch's Rprop, SparseAdam).
    Returns ``(gradient, decay)``::

        gradient(w, grad, flags) = clip(rescale_grad * (-grad if maximize else grad))
                                   + weight_decay * w          (coupled, torch's L2)
        decay(w, flags)          = w * (1 - lr * weight_decay)  (decoupled), else w

    maximize is a flag because torch's argument is a bool: each value has its own
    kernel, and the negation costs nothing per element.
    """
    lr = spec.hypers["lr"].node
    clipped_pre = gradient_preprocessing(spec, coupled_weight_decay=False)
    wd = None if weight_decay_default is None else spec.hyper(
        "weight_decay", weight_decay_default, "weight_decay >= 0",
        "weight decay: L2 on the gradient, or w * (1 - lr * weight_decay) when decoupled")
    spec.flag("maximize", False, "maximize the objective: step along +grad")
    if decoupled is None:
        spec.flag("decoupled_weight_decay", False,
                  "decay w by 1 - lr * weight_decay instead of adding weight_decay * w to g")

    def is_decoupled(flags: Any) -> bool:
        return flags.decoupled_weight_decay if decoupled is None else decoupled

    def gradient(w: Expr, grad: Expr, flags: Any) -> Expr:
        g = clipped_pre(w, -grad if flags.maximize else grad)
        return g if wd is None or is_decoupled(flags) else g + wd * w

    def decay(w: Expr, flags: Any) -> Expr:
        return w * (1 - lr * wd) if wd is not None and is_decoupled(flags) else w

    return gradient, decay


def torch_adam(spec: Spec, *, weight_decay_default: float,
               decoupled: bool | None) -> Callable[[Expr, Expr, Any], dict]:
    """torch.optim.Adam's rule (AdamW's with ``decoupled=True``), declared on ``spec``::

        g = torch_gradient(...)
        exp_avg, exp_avg_sq = moments(...)
        max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq); v = it       (amsgrad)
        w = decay(w) - lr / (1 - beta1**t) * exp_avg / (sqrt(v) / sqrt(1 - beta2**t) + eps)
    """
    lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
    beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of exp_avg")
    beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of exp_avg_sq")
    eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the bias-corrected sqrt(exp_avg_sq)")
    spec.flag("amsgrad", False, "divide by the running maximum of exp_avg_sq (AMSGrad)")
    gradient, decay = torch_gradient(spec, weight_decay_default=weight_decay_default,
                                     decoupled=decoupled)
    exp_avg = spec.state("exp_avg", 0.0, "first moment (mean of g)")
    exp_avg_sq = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
    max_sq = spec.state("max_exp_avg_sq", 0.0, "running maximum of exp_avg_sq",
                        when="amsgrad")
    t = spec.t

    def rule(w: Expr, grad: Expr, flags: Any) -> dict:
        m, v = moments(exp_avg, exp_avg_sq, gradient(w, grad, flags), beta1, beta2)
        new = {exp_avg: m, exp_avg_sq: v}
        if flags.amsgrad:
            v = new[max_sq] = maximum(max_sq, v)
        denom = sqrt(v) / sqrt(1 - beta2 ** t) + eps
        new[w] = decay(w, flags) - lr / (1 - beta1 ** t) * m / denom
        return new

    return rule


def newton_schulz_hypers(spec: Spec, of: str = "u",
                         names: dict[str, str] | None = None) -> tuple[Expr, tuple, Expr]:
    """Declare Muon's Newton-Schulz hyperparameters on ``spec`` (ns_steps, ns_a, ns_b,
    ns_c, ns_eps, with Keller Jordan's defaults; ``names`` renames them) and return
    (steps, (a, b, c), eps) for ``newton_schulz``; ``of``: the normalized matrix's name."""
    n = {k: k for k in ("ns_steps", "ns_a", "ns_b", "ns_c", "ns_eps")} | (names or {})
    steps = spec.hyper(n["ns_steps"], 5, f"0 <= {n['ns_steps']} <= 100",
                       "Newton-Schulz iterations", type="int")
    coefficients = (spec.hyper(n["ns_a"], 3.4445, doc="Newton-Schulz coefficient of X"),
                    spec.hyper(n["ns_b"], -4.7750, doc="Newton-Schulz coefficient of A = X X^T"),
                    spec.hyper(n["ns_c"], 2.0315, doc="Newton-Schulz coefficient of A A"))
    eps = spec.hyper(n["ns_eps"], 1e-7, f"{n['ns_eps']} > 0",
                     f"lower bound of ||{of}|| in the normalization")
    return steps, coefficients, eps


def newton_schulz(x: Expr, tall: bool, coefficients: tuple[Expr, Expr, Expr], steps: Expr,
                  eps: Expr) -> Expr:
    """X ~ the orthogonal factor U V^T of x = U S V^T: Muon's quintic Newton-Schulz
    iteration, ``steps`` times from x / max(||x||_F, eps), with (a, b, c) =
    ``coefficients``: A = X X^T, X = a X + (b A + c A A) X. ``tall`` (R > C): the same
    iteration on X^T, written on the C x C Gram matrix without transposing X."""
    a_, b_, c_ = coefficients

    def step(x):
        if tall:
            a = matmul(x.T, x)
            return a_ * x + matmul(x, b_ * a + c_ * matmul(a, a))
        a = matmul(x, x.T)
        return a_ * x + matmul(b_ * a + c_ * matmul(a, a), x)
    return repeat(steps, step, x / maximum(norm(x), eps))


def newton_schulz_bf16(x: Expr, tall: bool, coefficients: tuple[Expr, Expr, Expr],
                       steps: Expr, eps: Expr) -> Expr:
    """``newton_schulz`` as torch.optim.Muon computes it in bfloat16: every value it
    stores in bfloat16 is rounded to it (``round_bf16``), where it is rounded. x is cast
    and divided by its norm (rounded, clamped at eps, rounded); then A = bf16(X X^T),
    B = bf16(b A + c A A) (torch.addmm), X = bf16(a X + B X). ``tall`` (R > C): torch
    iterates on X^T; here on the C x C side without transposing X (A = bf16(X^T X),
    X = bf16(a X + X B)): the same sums, as B is symmetric, and no pass reads X
    transposed. The products are products of bfloat16 values summed in float32 (the
    planner makes each rounded sum one addmm, optgen/compiler/plan_matrix.py)."""
    a_, b_, c_ = coefficients
    x = round_bf16(x)
    scale = round_bf16(maximum(round_bf16(norm(x)), eps))

    def step(x):
        if tall:
            a = round_bf16(matmul(x.T, x))
            return round_bf16(a_ * x + matmul(x, round_bf16(b_ * a + c_ * matmul(a, a))))
        a = round_bf16(matmul(x, x.T))
        return round_bf16(a_ * x + matmul(round_bf16(b_ * a + c_ * matmul(a, a)), x))
    return repeat(steps, step, round_bf16(x / scale))
