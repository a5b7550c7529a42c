"""SVRG: stochastic variance-reduced gradient, a wrapper around any base optimizer
(MXNet's SVRGModule / _SVRGOptimizer; default base: sgd).

    g_vr = grad - grad_snapshot + full_grad
    the base rule (with its own rescale, clipping and weight decay) runs on g_vr

``grad`` is the mini-batch gradient at the current weights, ``grad_snapshot`` the same
mini-batch's gradient at the snapshot weights, and ``full_grad`` the full-data gradient
at the snapshot (mu). In MXNet's scheme the module keeps mu in extra "_full" parameters
that an _AssignmentOptimizer overwrites with the accumulated full gradient once per
snapshot (weight[:] = grad), and steps the other parameters with the default optimizer
on the variance-reduced gradient. Here the trainer keeps mu (the mean of the gradients
over the data at the snapshot, refreshed every few epochs) and passes it to every step;
the subtraction is fused into the base optimizer's kernel:

    opt = optgen.create("svrg", params, base="adam", lr=1e-3)
    opt.step(grads, grad_snapshot=snapshot_grads, full_grad=mu)

Reference: R. Johnson, T. Zhang, "Accelerating Stochastic Gradient Descent using
Predictive Variance Reduction", NIPS 2013.
"""
from optgen.dsl import Spec, base_spec


def wrap(base: Spec) -> Spec:
    spec = Spec.extend(base, f"svrg_{base.name}", __doc__, reference="Johnson & Zhang 2013")
    snapshot = spec.input("grad_snapshot", "the mini-batch gradient at the snapshot weights")
    full = spec.input("full_grad", "the full gradient at the snapshot weights (mu)")

    @spec.update
    def svrg(w, grad, flags):
        return base.rule(w, grad - snapshot + full, flags)

    return spec


spec = wrap(base_spec("sgd"))
