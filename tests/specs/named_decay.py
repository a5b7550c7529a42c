"""SGD with decoupled weight decay on some parameters only, chosen by name: a per-layer
rule through a name flag (tests/test_torch_names.py; no decay for biases and norms).

    w = w - lr * (grad + weight_decay * w)    if decayed (the name has neither "bias"
    w = w - lr * grad                          nor "norm"; unnamed parameters: decayed)
"""
from optgen.dsl import Spec

spec = Spec("named_decay", __doc__, reference="tests")
lr = spec.hyper("lr", 0.1, "lr >= 0", "learning rate")
weight_decay = spec.hyper("weight_decay", 0.5, "weight_decay >= 0", "decay factor")
spec.name_flag("decayed", ("bias", "norm"), "weight decay for this parameter")


@spec.update
def named_decay(w, grad, flags):
    if flags.decayed:
        return {w: w - lr * (grad + weight_decay * w)}
    return {w: w - lr * grad}
