"""Adam, in the torch.optim.Adam form (amsgrad, maximize, decoupled_weight_decay).

    g   = -grad if maximize else grad
    g   = g + weight_decay * w                                  (coupled, torch's default)
    w   = w * (1 - lr * weight_decay)                           (decoupled_weight_decay)
    exp_avg    = beta1 * exp_avg + (1 - beta1) * g
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    v   = max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)      (amsgrad; else v = exp_avg_sq)
    w   = w - lr / (1 - beta1**t) * exp_avg / (sqrt(v) / sqrt(1 - beta2**t) + eps)

eps is added to the bias-corrected sqrt(v), as torch (the seed spec adam.py adds it to
sqrt(v): MXNet's form). amsgrad, maximize and decoupled_weight_decay are flags: each
combination is its own fused kernel on every target, and amsgrad's max state exists only
in the amsgrad kernels. torch's betas are beta1, beta2; its state names are the states'.
rescale_grad and clip_gradient (off by default) are optgen's, for loss_scale and
clip_global_norm.

Reference: D. P. Kingma, J. Ba, "Adam", ICLR 2015; S. Reddi et al., "On the Convergence
of Adam and Beyond", ICLR 2018 (AMSGrad); torch.optim.Adam.
"""
from optgen.blocks import torch_adam
from optgen.dsl import Spec

spec = Spec("torch_adam", __doc__, reference="arXiv:1412.6980; torch.optim.Adam")
spec.update(torch_adam(spec, weight_decay_default=0.0, decoupled=None))
