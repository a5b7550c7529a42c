"""Shampoo with Adam grafting (Distributed Shampoo's per-layer rule, without blocking).

For a 2-D parameter W (R x C), at step t:

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    every precondition_frequency steps (a parameter's steps 1, 1 + f, ...), on the host:
        L_root = (L + epsilon I)^(-1/root)      R_root = (R + epsilon I)^(-1/root)   (eigh, float64)
    L   = shampoo_beta2 * L + (1 - shampoo_beta2) * g g^T      (shampoo_beta2 = 1: L + g g^T)
    R   = shampoo_beta2 * R + (1 - shampoo_beta2) * g^T g
    m   = beta1 * m + (1 - beta1) * g;       m_hat = m / (1 - beta1^t)
    v   = beta2 * v + (1 - beta2) * g * g;   a = m_hat / (sqrt(v / (1 - beta2^t)) + eps)
    P   = L_root @ m_hat @ R_root
    d   = P * ||a||_F / ||P||_F           if t >= start_preconditioning_step   else   a
    W   = W * (1 - lr * weight_decay) - lr * d

Parameters of any other rank, and those with a side longer than
``max_preconditioner_dim`` (8192), take the graft rule alone (d = a): bias-corrected Adam
with decoupled weight decay, and keep no statistics. (Distributed Shampoo splits such a
tensor into blocks of at most max_preconditioner_dim per side and preconditions each
block; this spec does not block.) The Shampoo direction borrows its per-layer norm from
Adam ("grafting", Agarwal et al. 2020), as Distributed Shampoo does with
AdamGraftingConfig.

A refresh runs before the step's update, so the roots used at steps 1 + k f .. (k + 1) f
come from the statistics of steps 1 .. k f: the first refresh sees L = 0, so
``start_preconditioning_step`` (None: f + 1) must come after it. ``root`` = 4 is the
paper's L^(-1/4) G R^(-1/4) for a matrix. Eigenvalues below 0 (round-off) give 0: the
root is a pseudo-inverse root.

``fresh_roots`` recomputes the roots as Distributed Shampoo does: on the steps f, 2f, ...,
from the statistics that include that step's gradient, divided by 1 - shampoo_beta2^t
when shampoo_beta2 < 1 (its use_bias_correction), and used from that step on
(start_preconditioning_step None: f; it must be >= f). ``precondition_1d`` gives 1-D
parameters Distributed Shampoo's rule for an order-1 tensor: one C x C statistic R of
the gradient as a row, P = m_hat @ (R + epsilon I)^(-1/2) (its exponent 1/(2 * order);
``root`` is the matrices'), grafted like a matrix's.

References: V. Gupta, T. Koren, Y. Singer, "Shampoo: Preconditioned Stochastic Tensor
Optimization", ICML 2018 (arXiv:1802.09568); H.-J. M. Shi et al., "A Distributed
Data-Parallel PyTorch Implementation of the Distributed Shampoo Optimizer for Training
Neural Networks At-Scale" (arXiv:2309.06497), facebookresearch/optimizers.
"""
from optgen.blocks import gradient_preprocessing, moments
from optgen.dsl import Spec, eye, inverse_root, matmul, maximum, norm, sqrt, where

spec = Spec("shampoo", __doc__, reference="arXiv:1802.09568")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate (of the grafted Adam norm)")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay of the filtered gradient m")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay of Adam's (the graft's) v")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to Adam's sqrt(v_hat) in the graft")
shampoo_beta2 = spec.hyper("shampoo_beta2", 1.0, "0 < shampoo_beta2 <= 1",
                           "decay of L and R (1: sums, as the paper)")
epsilon = spec.hyper("epsilon", 1e-12, "epsilon > 0", "damping added to L and R before roots")
root = spec.hyper("root", 4.0, "root > 0", "the roots are L^(-1/root), R^(-1/root)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0", "decoupled weight decay")
frequency = spec.hyper("precondition_frequency", 20, "precondition_frequency >= 1",
                       "steps between recomputations of the roots", type="int")
start = spec.hyper("start_preconditioning_step", None, "start_preconditioning_step >= 1",
                   "first step of the Shampoo direction; None: precondition_frequency + 1 "
                   "(fresh_roots: precondition_frequency)",
                   type="int", optional=True, none_value=0)
spec.flag("fresh_roots", False, "roots on steps f, 2f, ... from statistics that include "
          "the step's gradient, bias-corrected (Distributed Shampoo)")
spec.flag("precondition_1d", False, "1-D parameters get a C x C statistic and its "
          "root -1/2 (Distributed Shampoo); off: the graft alone")
spec.require("not (fresh_roots and start_preconditioning_step < precondition_frequency)",
             "with fresh_roots the first roots come at step precondition_frequency: "
             "start_preconditioning_step must not come before it")
spec.hyper("max_preconditioner_dim", 8192, "max_preconditioner_dim >= 1",
           "a parameter with a side longer than this takes the graft alone (no "
           "statistics kept); fixed when the optimizer is made", type="int")
spec.shape_flag("matrix", "ndim == 2 and rows <= max_preconditioner_dim and "
                "cols <= max_preconditioner_dim", "2-D parameters are preconditioned")
spec.shape_flag("vector", "ndim == 1 and cols <= max_preconditioner_dim",
                "1-D parameters (preconditioned with precondition_1d)")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
RIGHT = "matrix or (vector and precondition_1d)"
m = spec.state("m", 0.0, "filtered gradient (Adam's first moment)")
v = spec.state("v", 0.0, "Adam's second moment (the graft)")
L = spec.state("L", 0.0, "left statistic: sum of g g^T", shape="rr", when="matrix")
R = spec.state("R", 0.0, "right statistic: sum of g^T g", shape="cc", when=RIGHT)
L_root = spec.state("L_root", 0.0, "(L + epsilon I)^(-1/root)", shape="rr", when="matrix")
R_root = spec.state("R_root", 0.0, "(R + epsilon I)^(-1/root)", shape="cc", when=RIGHT)
t = spec.t


def accumulate(s, gg):
    """The new statistic: an average of g g^T (shampoo_beta2 < 1) or their sum."""
    return shampoo_beta2 * s + where(shampoo_beta2 < 1, 1 - shampoo_beta2, 1.0) * gg


@spec.refresh(every=frequency)
def refresh(w, grad, flags):
    vector = flags.vector and flags.precondition_1d
    if not (flags.matrix or vector):
        return {}
    left, right = L, R
    if flags.fresh_roots:               # this step's statistics, bias-corrected
        g = preprocess(w, grad)
        bc = where(shampoo_beta2 < 1, 1 - shampoo_beta2 ** t, 1.0)
        left, right = accumulate(L, matmul(g, g.T)) / bc, accumulate(R, matmul(g.T, g)) / bc
    if not flags.matrix:
        return {R_root: inverse_root(right + epsilon * eye("c"), 2.0)}
    return {L_root: inverse_root(left + epsilon * eye("r"), root),
            R_root: inverse_root(right + epsilon * eye("c"), root)}


@spec.update
def shampoo(w, grad, flags):
    g = preprocess(w, grad)
    m_new, v_new = moments(m, v, g, beta1, beta2)
    m_hat = m_new / (1 - beta1 ** t)
    graft = m_hat / (sqrt(v_new / (1 - beta2 ** t)) + eps)
    out = {m: m_new, v: v_new}
    d = graft
    if flags.matrix or (flags.vector and flags.precondition_1d):
        out[R] = accumulate(R, matmul(g.T, g))
        if flags.matrix:
            out[L] = accumulate(L, matmul(g, g.T))
            p = matmul(matmul(L_root, m_hat), R_root)
        else:
            p = matmul(m_hat, R_root)
        first = where(start > 0, start, frequency + (0 if flags.fresh_roots else 1))
        d = where(t >= first, p * (norm(graft) / maximum(norm(p), 1e-30)), graft)
    out[w] = w * (1 - lr * weight_decay) - lr * d
    return out
