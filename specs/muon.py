"""Muon: momentum orthogonalized by Newton-Schulz iterations (2-D weights), AdamW elsewhere.

For a 2-D parameter W (R x C), as torch.optim.Muon (in full precision):

    g   = clip(rescale_grad * grad, -clip_gradient, clip_gradient)
    m   = momentum * m + (1 - momentum) * g
    u   = (1 - momentum) * g + momentum * m     if nesterov  else  m
    X   = u / max(||u||_F, ns_eps)
    repeat ns_steps times:                      (R > C: on X^T, the C x C Gram matrix)
        A = X @ X^T;   B = ns_b * A + ns_c * A @ A;   X = ns_a * X + B @ X
    s   = sqrt(max(1, R / C))                   (rms_scale set: rms_scale * sqrt(max(R, C)))
    W   = W * (1 - lr * weight_decay) - lr * s * X

Parameters of any other rank follow the declared base optimizer, AdamW (specs/adamw.py:
the same lr, weight_decay, and its beta1, beta2, eps), as the Muon authors train embeddings,
norms and biases. The momentum buffer of a 2-D parameter is AdamW's ``m``; AdamW's ``v``
exists for the others only. ns_steps is read at run time: changing it never rebuilds.
``rms_scale=0.2`` is torch's ``adjust_lr_fn="match_rms_adamw"`` (the update's RMS then
matches AdamW's, so one lr serves both kinds of parameters).
Precision: this form runs the iterations in the parameter's dtype (float32 or float64);
torch.optim.Muon runs them in bfloat16, as the torch form does (specs/torch_muon.py).

References: K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks"
(2024), kellerjordan.github.io/posts/muon; J. Liu et al., "Muon is Scalable for LLM
Training", arXiv:2502.16982 (the 0.2 * sqrt(max(R, C)) scale); torch.optim.Muon.
"""
from optgen.blocks import rescale_and_clip
from optgen import blocks
from optgen.dsl import Spec, base_spec, maximum, sqrt, where

adamw = base_spec("adamw")
spec = Spec.extend(adamw, "muon", __doc__, reference="kellerjordan.github.io/posts/muon")
lr, weight_decay = spec.hypers["lr"].node, spec.hypers["weight_decay"].node
preprocess = rescale_and_clip(spec)
momentum = spec.hyper("momentum", 0.95, "0 <= momentum < 1", "momentum of the 2-D update")
ns_steps, (ns_a, ns_b, ns_c), ns_eps = blocks.newton_schulz_hypers(spec, "u")
spec.flag("nesterov", True, "orthogonalize the Nesterov look-ahead, not the buffer")
rms_scale = spec.hyper("rms_scale", None, "rms_scale > 0", "scale the 2-D update by "
                       "rms_scale * sqrt(max(R, C)) (Moonshot: 0.2); None: sqrt(max(1, R / C))",
                       optional=True, none_value=0.0)
spec.shape_flag("matrix", "ndim == 2", "2-D parameters take the Muon update")
spec.shape_flag("tall", "rows > cols", "R > C: iterate on the C x C Gram matrix (2-D)")
spec.restrict("v", when="not matrix")
m = spec.states["m"].node


def newton_schulz(x, tall):
    """X ~ the orthogonal factor U V^T of x = U S V^T (quintic iteration)."""
    return blocks.newton_schulz(x, tall, (ns_a, ns_b, ns_c), ns_steps, ns_eps)


@spec.update
def muon(w, grad, flags):
    if not flags.matrix:
        return adamw.rule(w, grad, flags)
    g = preprocess(grad)
    m_new = momentum * m + (1 - momentum) * g
    u = (1 - momentum) * g + momentum * m_new if flags.nesterov else m_new
    scale = where(rms_scale > 0, rms_scale * sqrt(maximum(spec.rows, spec.cols)),
                  sqrt(maximum(1.0, spec.rows / spec.cols)))
    x = newton_schulz(u, flags.tall)
    return {m: m_new, w: w * (1 - lr * weight_decay) - lr * scale * x}

