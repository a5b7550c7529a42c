"""Scion: a step along the linear minimization oracle (LMO) of a norm ball, chosen per layer
(the authors' Scion, ``norm="Auto"`` or ``"Sign"``).

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    d   = (1 - momentum) * d + momentum * g        (momentum: one minus the usual factor;
                                                    1: d = g, no averaging)
    u   = scale * lmo(d)
    w   = w * (1 - lr) - lr * u                    (constrained: stays in the ball of
                                                    radius scale, a Frank-Wolfe step)
    w   = w - lr * u                               (unconstrained)

The LMO (minus the direction of steepest descent in that norm, at unit norm):

    2-D (R = d_out x C = d_in), spectral: lmo(d) = sqrt(R / C) * X,
        X = d / max(||d||_F, ns_eps), then ns_steps Newton-Schulz iterations (Muon's,
        specs/muon.py; R > C: on the C x C Gram matrix)
    2-D with ``sign`` (the authors' "Sign", for an output layer): lmo(d) = sign(d) / C
    0-D and 1-D (the authors' "BiasRMS"): lmo(d) = d / (rms(d) + 1e-8)

Parameters of 3 or more dimensions (the authors' "SpectralConv" on the unfolded kernel) are
not built: they are left unchanged, and optgen.torch.Scion refuses them when it is made.
The authors iterate in bfloat16 and divide by ||d|| + 1e-7; this form iterates in the
parameter's dtype and divides by max(||d||, ns_eps), as specs/muon.py. Their ``init()``
(the norm-matched initialization) is the caller's to run before training.

Reference: T. Pethick, W. Xie, K. Antonakopoulos, Z. Zhu, A. Silveti-Falls, V. Cevher,
"Training Deep Learning Models with Norm-Constrained LMOs", arXiv:2502.07529 (ICML 2025);
the authors' Scion (github.com/LIONS-EPFL/scion, scion.py).
"""
from optgen import blocks
from optgen.blocks import gradient_preprocessing
from optgen.dsl import Spec, rms, sign, sqrt

spec = Spec("scion", __doc__, reference="arXiv:2502.07529")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate (constrained: also the decay of w)")
momentum = spec.hyper("momentum", 1.0, "0 <= momentum <= 1",
                      "weight of g in the average d (one minus the usual momentum)")
scale = spec.hyper("scale", 1.0, "scale > 0", "radius of the norm ball (the step's size)")
ns_steps, (ns_a, ns_b, ns_c), ns_eps = blocks.newton_schulz_hypers(spec, "d")
spec.flag("unconstrained", False, "w - lr * u (no decay of w by lr)")
spec.flag("sign", False, "2-D parameters take the sign LMO sign(d) / C, not the spectral")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
spec.shape_flag("matrix", "ndim == 2", "2-D parameters: the spectral (or sign) LMO")
spec.shape_flag("vector", "ndim <= 1", "0-D and 1-D parameters: the RMS LMO")
spec.shape_flag("tall", "rows > cols", "R > C: iterate on the C x C Gram matrix (2-D)")
buf = spec.state("momentum_buffer", 0.0, "the average d of the gradients")


def lmo(d, flags):
    """The authors' "Auto" LMO of d (or "Sign" on 2-D parameters), before ``scale``."""
    if not flags.matrix:
        return d / (rms(d) + 1e-8)
    if flags.sign:
        return sign(d) / spec.cols
    x = blocks.newton_schulz(d, flags.tall, (ns_a, ns_b, ns_c), ns_steps, ns_eps)
    return sqrt(spec.rows / spec.cols) * x


@spec.update
def scion(w, grad, flags):
    if not (flags.matrix or flags.vector):     # not built (see above): left unchanged
        return {buf: buf, w: w}
    g = preprocess(w, grad)
    d = (1 - momentum) * buf + momentum * g
    kept = w if flags.unconstrained else w * (1 - lr)
    return {buf: d, w: kept - lr * scale * lmo(d, flags)}
