"""SOAP-NAdam: SOAP with NAdam's Nesterov momentum in place of Adam in the eigenbasis
(heavyball 3.2.1, ``heavyball.SOAPNAdam``; SOAP: Vyas et al. 2024; NAdam: Dozat 2016).

SOAP's statistics, eigenbasis and refresh are specs/soap.py's, unchanged (its refresh
rule, reused). On a parameter's k-th step, after the first (which only fits the basis;
mu_product stays 1), t = k - 1:

    g'         = Q_L^T g Q_R                                  (the gradient in the eigenbasis)
    mu_t       = beta1 * (1 - 0.5 * 0.96**(t * momentum_decay))
    mu_next    = beta1 * (1 - 0.5 * 0.96**((t + 1) * momentum_decay))
    mu_product = mu_product * mu_t
    m          = beta1 * m + (1 - beta1) * g'
    v          = beta2 * v + (1 - beta2) * g' * g'
    d          = ((1 - mu_t) / (1 - mu_product) * g'
                  + mu_next / (1 - mu_product * mu_next) * m) / max(sqrt(v / (1 - beta2**t)), eps)
    W          = W * (1 - lr * weight_decay) - lr * Q_L d Q_R^T
    L, R       = SOAP's EMAs of g g^T and g^T g (shampoo_beta; negative: beta2)

The step is heavyball's: NAdam's momentum schedule (Dozat; torch.optim.NAdam's mu_t)
in the eigenbasis, heavyball's denominator max(sqrt(v_hat), eps) (torch's NAdam adds
eps instead) and its decoupled decay from the same W (SOAP's authors decay after the
step). Defaults are heavyball's: lr 3e-3, betas (0.9, 0.999), shampoo_beta 0.95, eps
1e-8, weight_decay 0.01, precondition_frequency 2, max_precond_dim 2048, momentum_decay
4e-3.

Where heavyball's SOAPNAdam differs (its SOAP machinery; docs/matrix.md): it refreshes
the basis after its step counts f, 2f, ... (this rule, as SOAP's authors: after every f
NAdam steps; the same for f = 1), and shifts the matrix of each power iteration by
1e-8 of its largest eigenvalue (more in float32: 64 n float32 epsilons); its statistics
are bias-corrected EMAs, which scales them and leaves the basis as it is.

References: heavyball (github.com/HomebrewML/HeavyBall), SOAPNAdam; N. Vyas et al.,
"SOAP: Improving and Stabilizing Shampoo using Adam", arXiv:2409.11321 (2024);
T. Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop.
"""
import dataclasses

from optgen.blocks import CLIPPED
from optgen.dsl import Spec, base_spec, clip, matmul, maximum, sqrt, where

soap = base_spec("soap")
spec = Spec.extend(soap, "soap_nadam", __doc__, reference="heavyball SOAPNAdam; arXiv:2409.11321")
for name in ("correct_bias", "normalize_grads"):   # SOAP's Adam options: NAdam corrects
    del spec.hypers[name]
# heavyball's defaults; the words where this step differs from SOAP's (None: SOAP's)
HEAVYBALL = {"beta1": (0.9, None), "beta2": (0.999, None), "shampoo_beta": (0.95, None),
             "precondition_frequency": (2, None), "max_precond_dim": (2048, None),
             "eps": (1e-8, "floor of sqrt(v_hat) in the denominator (heavyball's max)"),
             "weight_decay": (0.01, "decoupled weight decay, from the W the step starts at")}
for name, (value, doc) in HEAVYBALL.items():
    info = spec.hypers[name].info
    info = dataclasses.replace(info, default=value, doc=doc or info.doc)
    spec.hypers[name] = dataclasses.replace(spec.hypers[name], info=info)
hyper = {n: h.node for n, h in spec.hypers.items()}
lr, beta1, beta2, eps = hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"]
weight_decay, shampoo_beta = hyper["weight_decay"], hyper["shampoo_beta"]
rescale, bound = hyper["rescale_grad"], hyper["clip_gradient"]
momentum_decay = spec.hyper("momentum_decay", 4e-3, "momentum_decay >= 0",
                            "speed of NAdam's momentum schedule mu_t")
m, v, L, R, Q_L, Q_R = (spec.states[n].node for n in ("m", "v", "L", "R", "Q_L", "Q_R"))
mu_product = spec.state("mu_product", 1.0, "product of the momentum schedule mu_1 .. mu_t",
                        shape="scalar")
spec.refresh(every=hyper[soap.refresh_rule.every], start=soap.refresh_rule.start,
             dtype=soap.refresh_rule.dtype)(soap.refresh_rule.rule)   # SOAP's refresh, as it is
t = spec.t


def rotate(x, left, right):
    """left^T x right, a side without a basis (None) left as it is."""
    x = x if left is None else matmul(left.T, x)
    return x if right is None else matmul(x, right)


@spec.update
def soap_nadam(w, grad, flags):
    g = clip(grad * rescale, -bound, bound)      # SOAP's rescale and clip (its hypers)
    g.tag = CLIPPED
    q_l = Q_L if flags.left else None
    q_r = Q_R if flags.right else None
    n = maximum(t - 1, 1)     # the NAdam step count (step 1 only fits the basis)
    mu = beta1 * (1 - 0.5 * 0.96 ** (n * momentum_decay))
    mu_next = beta1 * (1 - 0.5 * 0.96 ** ((n + 1) * momentum_decay))
    product = mu_product * mu
    g_rot = rotate(g, q_l, q_r)
    m_new = beta1 * m + (1 - beta1) * g_rot
    v_new = beta2 * v + (1 - beta2) * g_rot * g_rot
    direction = ((1 - mu) / (1 - product) * g_rot + mu_next / (1 - product * mu_next) * m_new) \
        / maximum(sqrt(v_new / (1 - beta2 ** n)), eps)
    step = rotate(direction, None if q_l is None else q_l.T, None if q_r is None else q_r.T)
    first = t <= 1
    out = {m: where(first, m, m_new), v: where(first, v, v_new),
           mu_product: where(first, mu_product, product),
           w: where(first, w, w * (1 - lr * weight_decay) - lr * step)}
    sb = where(shampoo_beta >= 0, shampoo_beta, beta2)
    if flags.left:
        out[L] = sb * L + (1 - sb) * matmul(g, g.T)
    if flags.right:
        out[R] = sb * R + (1 - sb) * matmul(g.T, g)
    return out
