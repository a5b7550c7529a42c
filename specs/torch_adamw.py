"""AdamW, in the torch.optim.AdamW form (amsgrad, maximize).

    g   = -grad if maximize else grad
    w   = w * (1 - lr * weight_decay)                           (decoupled, default 1e-2)
    exp_avg    = beta1 * exp_avg + (1 - beta1) * g
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    v   = max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)      (amsgrad; else v = exp_avg_sq)
    w   = w - lr / (1 - beta1**t) * exp_avg / (sqrt(v) / sqrt(1 - beta2**t) + eps)

The rule is torch_adam's with decoupled weight decay always on (torch.optim.AdamW is
Adam(decoupled_weight_decay=True)), shared through optgen.blocks.torch_adam.

Reference: I. Loshchilov, F. Hutter, "Decoupled Weight Decay Regularization", ICLR 2019;
torch.optim.AdamW.
"""
from optgen.blocks import torch_adam
from optgen.dsl import Spec

spec = Spec("torch_adamw", __doc__, reference="arXiv:1711.05101; torch.optim.AdamW")
spec.update(torch_adam(spec, weight_decay_default=1e-2, decoupled=True))
