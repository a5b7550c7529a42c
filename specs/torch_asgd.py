"""ASGD (averaged SGD), in the torch.optim.ASGD form (eta, mu, ax).

    g   = -grad if maximize else grad
    g   = g + weight_decay * w
    w   = w * (1 - lambd * eta) - eta * g                   (eta: the old value)
    ax  = w                              if mu == 1
          ax + mu * (w - ax)             otherwise           (w: the new value)
    eta = lr / (1 + lambd * lr * t)**alpha
    mu  = 1 / max(1, t - t0)

eta (starting at lr) and mu (starting at 1) are torch's per-parameter scalars: scalar
states updated on the host. ax is the running average of w from step t0 on. maximize is
a flag (torch's bool: its own kernel).

Reference: B. T. Polyak, A. B. Juditsky, "Acceleration of Stochastic Approximation by
Averaging", SIAM J. Control Optim. 1992; torch.optim.ASGD.
"""
from optgen.blocks import torch_gradient
from optgen.dsl import Spec, eq, maximum, where

spec = Spec("torch_asgd", __doc__, reference="Polyak & Juditsky 1992; torch.optim.ASGD")
lr = spec.hyper("lr", 1e-2, "lr >= 0", "learning rate (eta's start)")
lambd = spec.hyper("lambd", 1e-4, doc="decay term")
alpha = spec.hyper("alpha", 0.75, doc="power for the eta update")
t0 = spec.hyper("t0", 1e6, doc="step at which averaging starts")
gradient, _ = torch_gradient(spec)
eta = spec.state("eta", lr, "step size of this step", shape="scalar")
mu = spec.state("mu", 1.0, "averaging weight of this step", shape="scalar")
ax = spec.state("ax", 0.0, "average of w")
t = spec.t


@spec.update
def torch_asgd(w, grad, flags):
    g = gradient(w, grad, flags)
    w_new = w * (1 - lambd * eta) - eta * g
    return {w: w_new, ax: where(eq(mu, 1.0), w_new, ax + (w_new - ax) * mu),
            eta: lr / (1 + lambd * lr * t) ** alpha, mu: 1 / maximum(1.0, t - t0)}
