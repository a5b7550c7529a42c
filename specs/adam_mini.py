"""Adam-mini: Adam with one second moment per block of a weight instead of one per
element (a block: a query/key head, an output neuron, a whole tensor).

    w     = w - lr * weight_decay * w                       (decoupled, before the step)
    m     = beta1 * m + (1 - beta1) * g
    shared:     v = beta2 * v + (1 - beta2) * head_mean(g * g, heads)   (a value per block)
    not shared: v = beta2 * v + (1 - beta2) * g * g                     (Adam: biases)
    w     = w - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)

head_mean views the weight as [heads, R/heads, C] (R rows, C columns; a 1-D tensor is
one row) and averages g * g over each head: heads = n_heads for a query weight (a block
per head), heads = R for one block per output neuron (row), heads = 1 for one block per
tensor. v is kept per row (``shape="row"``), equal for the rows of a block. ``shared``
is a name flag, off for names containing "bias" (the authors' Adam blocks); heads is
set per parameter group (optgen.torch.AdamMini puts each parameter in its own group,
as the authors' Adam_mini does, and sets it from the parameter's name).

Reference: Y. Zhang et al., "Adam-mini: Use Fewer Learning Rates To Gain More",
ICLR 2025 (arXiv:2406.16793); the authors' Adam_mini (pip adam-mini,
github.com/zyushun/Adam-mini).
"""
from optgen.dsl import Spec, head_mean, sqrt

spec = Spec("adam_mini", __doc__, reference="arXiv:2406.16793")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "decay rate of the first moment",
                   tuple="betas")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "decay rate of the block second moment",
                   tuple="betas")
eps = spec.hyper("eps", 1e-8, "eps >= 0", "added to the bias-corrected sqrt(v)")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "decoupled weight decay, scaled by lr")
heads = spec.hyper("heads", 1, "heads >= 1",
                   "blocks of rows sharing v: n_heads (query/key), rows (neurons), 1 (tensor)",
                   type="int")
spec.name_flag("shared", exclude=("bias",),
               doc="one second moment per block of rows; off: per element (biases)")
m = spec.state("m", 0.0, "first moment")
v = spec.state("v", 0.0, "second moment per element (not shared)", when="not shared")
vmean = spec.state("vmean", 0.0, "second moment of each row's block (shared)", shape="row",
                   when="shared")
t = spec.t


@spec.update
def adam_mini(w, grad, flags):
    m_new = beta1 * m + (1 - beta1) * grad
    if flags.shared:
        v_new = beta2 * vmean + (1 - beta2) * head_mean(grad * grad, heads)
        new = {vmean: v_new}
    else:
        v_new = beta2 * v + (1 - beta2) * grad * grad
        new = {v: v_new}
    h = sqrt(v_new) / sqrt(1 - beta2 ** t) + eps
    step = lr / (1 - beta1 ** t) * m_new / h
    return {**new, m: m_new, w: w - lr * weight_decay * w - step}
