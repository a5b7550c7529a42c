"""A user spec with nested whole-tensor reductions (tests/test_distributed.py): SGD on
the centered gradient, normalized by its RMS.

    c = g - mean(g)
    w = w - lr * c / (rms(c) + eps)

rms(c) reads mean(g): two reduction levels, so a sharded step sums twice.
"""
from optgen.dsl import Spec, mean, rms

spec = Spec("centered_nsgd", __doc__)
lr = spec.hyper("lr", 0.01, "lr >= 0", "learning rate")
eps = spec.hyper("eps", 1e-8, "eps > 0", "added to the RMS")


@spec.update
def centered_nsgd(w, grad, flags):
    c = grad - mean(grad)
    return {w: w - lr * c / (rms(c) + eps)}
