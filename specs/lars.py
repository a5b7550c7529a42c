"""LARS: layer-wise adaptive rate scaling, a wrapper around any base optimizer
(MindSpore LARS; default base: momentum).

    g      = clip(rescale_grad * grad, -clip_gradient, clip_gradient)     (the base's)
    lambda = coefficient * ||w|| / (||g|| + weight_decay * ||w|| + epsilon)
             if ||w|| > 0 and ||g|| > 0, else 1
    lambda = min(lambda / lr, 1)                                          (use_clip)
    the base rule then runs on lambda * (g + weight_decay * w)

Norms are L2 over the whole tensor, computed in a first pass. weight_decay and lr are the
base's hyperparameters; the base does not apply its weight decay again. The base must
use coupled weight decay (sgd, momentum, nag, adam, rmsprop, ...).

As MindSpore's lars_filter, parameters whose name contains "LayerNorm" or "bias" are
left out: they step the base rule on g itself (no LARS scaling, no weight decay). Name
the parameters with ``param_names=[...]``; replace the rule with
``name_filters={"apply_lars": lambda name: ...}``. Unnamed parameters get LARS.

    optgen.create("lars", params)                     # LARS(momentum)
    optgen.create("lars", params, base="adam")        # LARS(adam)
    optgen.create("lars", params, param_names=["fc.weight", "fc.bias"])
    optgen build lars --base adam

Reference: Y. You, I. Gitman, B. Ginsburg, "Large Batch Training of Convolutional
Networks", arXiv:1708.03888.
"""
from optgen.blocks import preprocessed, rescale_and_clip
from optgen.dsl import Spec, base_spec, minimum, norm, where
from optgen.errors import SpecError


def wrap(base: Spec) -> Spec:
    if base.preprocessing != "coupled":
        raise SpecError(f"LARS needs a base with coupled weight decay (the gradient "
                        f"preprocessing block); {base.name!r} has "
                        f"{base.preprocessing or 'no preprocessing block'}")
    spec = Spec.extend(base, f"lars_{base.name}", __doc__, reference="arXiv:1708.03888")
    coefficient = spec.hyper("coefficient", 0.001, "coefficient > 0",
                             "trust coefficient of the local learning rate")
    epsilon = spec.hyper("epsilon", 1e-5, "epsilon >= 0", "added to the ratio's denominator")
    spec.flag("use_clip", False, "clip the local learning rate: min(lambda / lr, 1)")
    spec.name_flag("apply_lars", ("LayerNorm", "bias"),
                   "LARS for this parameter (off for LayerNorm and bias parameters)")
    lr, wd = base.hypers["lr"].node, base.hypers["weight_decay"].node
    rescale_clip = rescale_and_clip(base)

    @spec.update
    def lars(w, grad, flags):
        g = rescale_clip(grad)
        if not flags.apply_lars:
            return base.rule(w, preprocessed(g), flags)
        n_w, n_g = norm(w), norm(g)
        ratio = where((n_w > 0) & (n_g > 0), coefficient * n_w / (n_g + wd * n_w + epsilon), 1.0)
        if flags.use_clip:
            ratio = minimum(ratio / lr, 1.0)
        return base.rule(w, preprocessed(ratio * (g + wd * w)), flags)

    return spec


spec = wrap(base_spec("momentum"))
