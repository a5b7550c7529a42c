"""Muon, in the torch.optim.Muon form: momentum orthogonalized by Newton-Schulz, 2-D only.

For a 2-D parameter W (R x C):

    g   = grad
    momentum_buffer = lerp(momentum_buffer, g, 1 - momentum)
    u   = lerp(g, momentum_buffer, momentum)   if nesterov  else  momentum_buffer
          (lerp: torch.lerp, rounded as torch rounds it; optgen.ir)
    X   = bf16(u)
    X   = bf16(X / bf16(max(bf16(||X||_F), eps)))
    repeat ns_steps times:                       bf16: rounded to bfloat16
        A = bf16(X @ X^T);   B = bf16(ns_b * A + ns_c * A @ A);   X = bf16(ns_a * X + B @ X)
    (R > C: torch iterates on X^T; here A = bf16(X^T X), X = bf16(ns_a * X + X @ B))
    s   = 0.2 * sqrt(max(R, C))   if match_rms_adamw   else   sqrt(max(1, R / C))
    W   = W * (1 - lr * weight_decay) - lr * s * X

torch's ns_coefficients are (ns_a, ns_b, ns_c); its adjust_lr_fn None or "original" is
match_rms_adamw False, "match_rms_adamw" True (a flag: a choice between two rules, as
torch's string). ns_steps is read at run time. torch refuses parameters that are not 2-D
(a ValueError at its step) and optgen.torch.Muon refuses them when it is made; a spec
cannot refuse a shape, so here they are left unchanged (the seed muon.py steps them with
AdamW). torch has no maximize. The iterations are torch's, in bfloat16: each product
is one of bfloat16 values summed in float32 and rounded to bfloat16 with its addend
(torch.addmm); for torch tensors the runtime runs them in torch's own matmul.

References: K. Jordan et al., "Muon: An optimizer for hidden layers in neural networks"
(2024), kellerjordan.github.io/posts/muon; J. Liu et al., "Muon is Scalable for LLM
Training", arXiv:2502.16982 (match_rms_adamw); torch.optim.Muon.
"""
from optgen.blocks import gradient_preprocessing
from optgen import blocks
from optgen.dsl import Spec, lerp, maximum, sqrt

spec = Spec("torch_muon", __doc__, reference="kellerjordan.github.io/posts/muon; "
            "torch.optim.Muon")
lr = spec.hyper("lr", 1e-3, "lr >= 0", "learning rate")
momentum = spec.hyper("momentum", 0.95, "momentum >= 0", "momentum factor")
ns_a = spec.hyper("ns_a", 3.4445, doc="ns_coefficients[0]: Newton-Schulz coefficient of X")
ns_b = spec.hyper("ns_b", -4.775, doc="ns_coefficients[1]: coefficient of A = X X^T")
ns_c = spec.hyper("ns_c", 2.0315, doc="ns_coefficients[2]: coefficient of A A")
eps = spec.hyper("eps", 1e-7, "eps > 0", "lower bound of ||u|| in the normalization")
ns_steps = spec.hyper("ns_steps", 5, "0 <= ns_steps < 100", "Newton-Schulz iterations",
                      type="int")
spec.flag("nesterov", True, "orthogonalize the Nesterov look-ahead, not the buffer")
spec.flag("match_rms_adamw", False, "adjust_lr_fn='match_rms_adamw': scale by "
          "0.2 * sqrt(max(R, C)) instead of sqrt(max(1, R / C))")
preprocess = gradient_preprocessing(spec, coupled_weight_decay=False)
weight_decay = spec.hyper("weight_decay", 0.1, "weight_decay >= 0",
                          "decoupled: w is scaled by 1 - lr * weight_decay (the unadjusted lr)")
spec.shape_flag("matrix", "ndim == 2", "2-D parameters (the only ones torch.optim.Muon takes)")
spec.shape_flag("tall", "rows > cols", "R > C: iterate on the C x C Gram matrix")
buf = spec.state("momentum_buffer", 0.0, "momentum of g")


def newton_schulz(x, tall):
    """X ~ the orthogonal factor U V^T of x = U S V^T (torch's quintic iteration, in
    bfloat16 as torch runs it)."""
    return blocks.newton_schulz_bf16(x, tall, (ns_a, ns_b, ns_c), ns_steps, eps)


@spec.update
def torch_muon(w, grad, flags):
    if not flags.matrix:          # torch refuses these; its drop-in does too (see above)
        return {buf: buf, w: w}
    g = preprocess(w, grad)
    b = lerp(buf, g, 1 - momentum)
    # torch's lerp to the bit: the bfloat16 iterations amplify a difference in u's last bit
    u = lerp(g, b, momentum) if flags.nesterov else b
    if flags.match_rms_adamw:
        scale = 0.2 * sqrt(maximum(spec.rows, spec.cols))
    else:
        scale = sqrt(maximum(1.0, spec.rows / spec.cols))
    return {buf: b, w: w * (1 - lr * weight_decay) - lr * scale * newton_schulz(u, flags.tall)}
