"""THOR: layer-wise Kronecker-factored natural gradient (MindSpore / TinyMS ``thor``).

For a 2-D weight W (R = outputs x C = inputs) with gradient g:

    every `frequency` steps (a parameter's steps 1, 1 + frequency, ...), on the host:
        A_inv = (A / batch_size + damping * I)^-1        A = sum over the batch of a a^T
        G_inv = (G * batch_size + damping * I)^-1        G = sum over the batch of d d^T
    d = G_inv @ (rescale_grad * g) @ A_inv
    d = d + weight_decay * W                   (the runtime's decay_filter may exclude names)
    d = d / max(||d||, 1)                                (enable_clip_grad)
    m = momentum * m + d
    W = W - lr * m                     (use_nesterov: W - lr * (d + momentum * m))

``a`` are the layer's input rows and ``d`` the gradients of the mean loss with respect to
its output rows; the trainer passes A (C x C) and G (R x R) to ``step(grads, A=[...],
G=[...])`` on the steps where ``opt.refresh_due`` (optgen.torch.KFACStatistics collects
them with hooks). The seed's formula uses one damping for both factors; MindSpore's code
splits sqrt(damping) between them. Other parameters (biases) take momentum SGD with the
same weight decay, clipping and momentum, as in MindSpore.

Gradients are divided by the runtime's ``loss_scale`` (fused into rescale_grad), so A and G
are computed from the unscaled loss. MindSpore applies the weight decay after the
preconditioning, as here. ``split_indices`` (the all-reduce grouping of A/G across devices)
is accepted and unused: optgen runs in one process.

Reference: M. Chen et al., "THOR: Trace-based Hardware-driven Layer-ORiented Natural
Gradient Descent Computation", AAAI 2021 (arXiv:2011.14244); tinyms.optimizers.thor.
"""
from optgen.blocks import rescale_and_clip
from optgen.dsl import Spec, eye, inverse, matmul, maximum, norm

spec = Spec("thor", __doc__, reference="arXiv:2011.14244")
lr = spec.hyper("lr", 0.05, "lr >= 0", "learning rate (the seed's learning_rate)")
damping = spec.hyper("damping", 0.03, "damping > 0", "lambda added to both Kronecker factors")
momentum = spec.hyper("momentum", 0.9, "momentum >= 0", "momentum of the preconditioned step")
weight_decay = spec.hyper("weight_decay", 0.0, "weight_decay >= 0",
                          "L2 penalty, added after the preconditioning")
batch_size = spec.hyper("batch_size", 32, "batch_size >= 1",
                        "the batch A and G were summed over (normalizes the factors)")
frequency = spec.hyper("frequency", 100, "frequency >= 2",
                       "steps between refreshes of A_inv and G_inv", type="int")
rescale = spec.hyper("rescale_grad", 1.0, "rescale_grad > 0",
                     "multiply the gradient by this first (the runtime's loss_scale)")
bound = spec.hyper("clip_gradient", None, "clip_gradient >= 0",
                   "clip the rescaled gradient elementwise to [-c, c]; None disables",
                   optional=True, none_value=float("inf"))
spec.flag("use_nesterov", False, "Nesterov momentum")
spec.flag("enable_clip_grad", False, "clip each step d to L2 norm 1 (MindSpore's ClipByNorm)")
spec.shape_flag("matrix", "ndim == 2", "2-D weights are preconditioned")
spec.accept("split_indices", "distributed all-reduce grouping of A and G: unused here")
A = spec.statistic("A", "cc", "sum over the batch of a a^T (a: the layer's input rows)")
G = spec.statistic("G", "rr", "sum over the batch of d d^T (d: d(mean loss)/d(output) rows)")
A_inv = spec.state("A_inv", 0.0, "(A / batch_size + damping I)^-1", shape="cc", when="matrix")
G_inv = spec.state("G_inv", 0.0, "(G * batch_size + damping I)^-1", shape="rr", when="matrix")
m = spec.state("m", 0.0, "momentum")
preprocess = rescale_and_clip(spec)


@spec.refresh(every=frequency)
def refresh(w, flags):
    if not flags.matrix:
        return {}
    return {A_inv: inverse(A / batch_size + damping * eye("c")),
            G_inv: inverse(G * batch_size + damping * eye("r"))}


@spec.update
def thor(w, grad, flags):
    d = preprocess(grad)
    if flags.matrix:
        d = matmul(matmul(G_inv, d), A_inv)
    d = d + weight_decay * w          # (decay_filter / wd_mult set it to 0 per parameter)
    if flags.enable_clip_grad:
        d = d / maximum(norm(d), 1.0)
    m_new = momentum * m + d
    step = d + momentum * m_new if flags.use_nesterov else m_new
    return {m: m_new, w: w - lr * step}
