"""SGD pulled back toward the parameter's initial value (a state that starts as w).

    w = w - lr * grad + k * (w0 - w)        w0: the parameter when the optimizer took it
"""
from optgen.dsl import Spec

spec = Spec("pull_to_start", __doc__)
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
k = spec.hyper("k", 0.2, "0 <= k <= 1", "pull toward the initial value")
w0 = spec.state("w0", "w", "the parameter's initial value")


@spec.update
def pull_to_start(w, grad, flags):
    return {w0: w0, w: w - lr * grad + k * (w0 - w)}
