"""SparseAdam, in the torch.optim.SparseAdam form: Adam on the rows a row-sparse gradient
names, through the lazy row-sparse kernels.

    g          = -grad if maximize else grad              (the listed rows only)
    exp_avg    = beta1 * exp_avg + (1 - beta1) * g
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
    w          = w - lr * sqrt(1 - beta2**t) / (1 - beta1**t) * exp_avg / (sqrt(exp_avg_sq) + eps)

Pass an ``optgen.RowSparse(indices, rows)`` gradient: only those rows of w, exp_avg and
exp_avg_sq change (torch's sparse_mask), duplicate indices are summed (torch's coalesce).
eps is added to sqrt(exp_avg_sq) and the bias corrections sit in the step size, as torch's
SparseAdam (unlike its Adam). There is no weight decay. maximize is a flag (torch's bool:
its own kernel).

Reference: D. P. Kingma, J. Ba, "Adam", ICLR 2015; torch.optim.SparseAdam.
"""
from optgen.blocks import moments, torch_gradient
from optgen.dsl import Spec, sqrt

spec = Spec("torch_sparseadam", __doc__, reference="arXiv:1412.6980; torch.optim.SparseAdam")
lr = spec.hyper("lr", 1e-3, "lr > 0", "learning rate")
beta1 = spec.hyper("beta1", 0.9, "0 <= beta1 < 1", "betas[0]: decay rate of exp_avg")
beta2 = spec.hyper("beta2", 0.999, "0 <= beta2 < 1", "betas[1]: decay rate of exp_avg_sq")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to sqrt(exp_avg_sq)")
gradient, _ = torch_gradient(spec, weight_decay_default=None)
exp_avg = spec.state("exp_avg", 0.0, "first moment (mean of g)")
exp_avg_sq = spec.state("exp_avg_sq", 0.0, "second moment (mean of g*g)")
spec.lazy_update_default = True
t = spec.t


@spec.update
def torch_sparseadam(w, grad, flags):
    m, v = moments(exp_avg, exp_avg_sq, gradient(w, grad, flags), beta1, beta2)
    step = lr * sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
    return {exp_avg: m, exp_avg_sq: v, w: w - step * m / (sqrt(v) + eps)}
