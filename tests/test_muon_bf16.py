"""optgen.torch.Muon is torch.optim.Muon in torch's precision: Newton-Schulz in
bfloat16 (specs/torch_muon.py, optgen/compiler/plan_matrix.py's rounded products).

Compared with torch's class itself and with an oracle written here from the published
rule (K. Jordan's Muon, torch.optim.Muon's documentation): every value torch stores in
bfloat16 rounded to it, products of bfloat16 values summed in float32. The bfloat16
iterations amplify a difference in one rounding (two of 65536 inputs one bfloat16 step
apart move the result by 2 %), so equality to float32 round-off needs every rounding of
torch's, its lerp's included.
"""
import os
import shutil

import numpy as np
import pytest
import torch

import optgen
import optgen.torch as otorch
from optgen.compiler import pipeline
from optgen.runtime.artifact import Artifact

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(64, 64), (32, 96), (96, 32)]
CASES = [dict(lr=2e-2),
         dict(lr=2e-2, nesterov=False, adjust_lr_fn="match_rms_adamw", weight_decay=0.05)]


def oracle_step(w, g, buf, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                coefficients=(3.4445, -4.775, 2.0315), eps=1e-7, ns_steps=5,
                adjust_lr_fn=None):
    """One Muon step from the rule: momentum, Nesterov look-ahead, quintic Newton-Schulz
    on the bfloat16 value (on X^T for tall X), the shape's learning-rate factor."""
    buf.lerp_(g, 1 - momentum)                            # buf + (1 - mu) (g - buf)
    u = torch.lerp(g, buf, momentum) if nesterov else buf.clone()
    a, b, c = coefficients
    x = u.to(torch.bfloat16)
    if x.shape[0] > x.shape[1]:
        x = x.T
    x = x / torch.clamp(torch.linalg.vector_norm(x.float()).to(torch.bfloat16), min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T                                      # bfloat16 products
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    if u.shape[0] > u.shape[1]:
        x = x.T
    rows, cols = w.shape
    scale = 0.2 * max(rows, cols) ** 0.5 if adjust_lr_fn == "match_rms_adamw" \
        else max(1.0, rows / cols) ** 0.5
    w.mul_(1 - lr * weight_decay).sub_(lr * scale * x.float())


def run(shape, kw, steps, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(shape, generator=gen) * 0.1
    grads = [torch.randn(shape, generator=gen) for _ in range(steps)]
    p_ref, p_opt = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    ref, opt = torch.optim.Muon([p_ref], **kw), otorch.Muon([p_opt], **kw)
    w_or, buf = w0.clone(), torch.zeros(shape)
    errs = []
    for g in grads:
        p_ref.grad, p_opt.grad = g.clone(), g.clone()
        ref.step()
        opt.step()
        oracle_step(w_or, g, buf, **kw)
        scale = p_ref.detach().abs().max()
        errs.append((float((p_opt.detach() - p_ref.detach()).abs().max() / scale),
                     float((p_opt.detach() - w_or).abs().max() / scale)))
    return errs


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("shape", SHAPES)
def test_muon_is_torch_muon_in_bfloat16(shape, kw):
    """Ten steps equal torch's to float32 round-off: the update's last bits (torch rounds
    w * (1 - lr * wd) before adding the step, optgen once), a few 1e-7 of max|w| (the
    float32 iterations were 3.5e-3 off)."""
    errs = run(shape, kw, 10)
    assert max(e for pair in errs for e in pair) < 2e-6, errs


def test_rounded_products_compiled_for_numpy():
    """numpy arrays run the compiled llvm products (float32 sums of bfloat16 values,
    rounded once). With one Newton-Schulz iteration a sum that rounds the other way (the
    order of the float32 additions differs from torch's) changes one element by one
    bfloat16 step: nearly every element equals the oracle's to float32 round-off, and
    none is further than bfloat16's resolution (float32 iterations: every element off)."""
    gen = torch.Generator().manual_seed(3)
    w0, g = torch.randn((48, 80), generator=gen) * 0.1, torch.randn((48, 80), generator=gen)
    kw = dict(lr=2e-2, ns_steps=1)
    w = w0.numpy().copy()
    opt = optgen.create("torch_muon", [w], lr=2e-2, ns_steps=1)
    opt.step([g.numpy().copy()])
    w_or = w0.clone()
    oracle_step(w_or, g, torch.zeros_like(g), **kw)
    moved = float((w_or - w0).abs().max())
    err = np.abs(w - w_or.numpy())
    assert err.max() < 2 ** -7 * moved
    assert np.mean(err > 1e-5 * moved) < 0.01, np.mean(err > 1e-5 * moved)


def test_nearest_bfloat16_is_torchs_rounding():
    """The reference's and the runtime's rounding (optgen.core.rounding, ties to even)
    equal torch's float32 -> bfloat16 conversion, ties, subnormals, inf and NaN too."""
    from optgen.core.rounding import nearest_bfloat16
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4096, generator=gen) * 10.0 ** torch.randint(-40, 38, (4096,),
                                                                        generator=gen),
                   torch.tensor([0.0, -0.0, 1e-40, float("inf"), -float("inf"), 3.4e38]),
                   # ties: the 16 dropped bits are 0x8000, kept lsb even and odd
                   torch.tensor([0x3F808000, 0x3F818000, 0xBF808000], dtype=torch.int64)
                   .to(torch.int32).view(torch.float32)])
    want = x.to(torch.bfloat16).float().numpy()
    got = nearest_bfloat16(x.numpy())
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isnan(nearest_bfloat16(np.array([np.nan], np.float32)))[0]


def test_torch_muon_builds_for_cuda_with_rounded_library_products(tmp_path):
    """On cuda the three products of an iteration are library launches carrying torch's
    addmm (alpha, beta, addend, rounded to bfloat16); the default variant's elementwise
    passes (bfloat16 rounding and lerp included) compile, with nvcc where it is."""
    path = os.path.join(ROOT, "specs", "torch_muon.py")
    built = pipeline.build(path, "cuda", out=str(tmp_path), variants=None)
    art = Artifact.load(built.path)
    defaults = {f: h.default for f, h in art.flags.items()}
    name = next(n for n, v in art.variants.items()
                if v["param_dtype"] == "float32" and v["flags"] == defaults)
    pipeline.build(path, "cuda", out=str(tmp_path), variants=[name])
    files = os.listdir(os.path.join(built.path, name))
    source = open(os.path.join(built.path, name, "kernels.cu"), encoding="utf-8").read()
    assert "__global__" in source and str(0xFFFF0000) in source   # (round_bf16's mask)
    if shutil.which("nvcc"):
        assert any(f.endswith(".cubin") for f in files), files
    launches = [ln for k in art.manifest["kernels"] if k["flags"].get("matrix")
                for ln in k["launches"]]
    products = [ln for ln in launches if ln["kind"] == "matmul"]
    assert products and all(ln["library"] == "matmul" and ln["symbol"] is None and
                            ln["matmul"]["round"] == "bfloat16" for ln in products)
    assert {(m["alpha"], m["beta"]) for m in (ln["matmul"] for ln in products)} == \
        {(None, None), ("ns_c", "ns_b"), (None, "ns_a")}


ROUNDED = '''\
"""Rounded products: one fused (bfloat16 operands and addend), one not (g is not)."""
from optgen.dsl import Spec, matmul, round_bf16

spec = Spec("rounded", __doc__, reference="tests/test_muon_bf16.py")
lr = spec.hyper("lr", 0.05, "lr >= 0", "step")
c = spec.hyper("c", 0.5, doc="scale of the product")
spec.shape_flag("matrix", "ndim == 2")


@spec.update
def rounded(w, grad, flags):
    if not flags.matrix:
        return {w: w - lr * grad}
    a = round_bf16(matmul(grad, grad.T))              # g is no bfloat16 value: not fused
    x = round_bf16(grad)
    b = round_bf16(c * matmul(round_bf16(a), x) + x)  # fused: one addmm
    return {w: w - lr * b}
'''


def test_a_product_is_one_rounded_pass_only_of_bfloat16_values(tmp_path):
    """The planner fuses ``round_bf16(c * a @ b + x)`` into one product only where a, b
    and x are bfloat16 values (else the pass would round what the rule does not): the
    compiled plan equals the reference interpreter's rule (float64: the sums of a few
    bfloat16 products are exact, so bit for bit but for no rounding)."""
    path = tmp_path / "rounded.py"
    path.write_text(ROUNDED)
    rng = np.random.default_rng(0)
    shapes = [(6, 4), (3, 7)]
    params = [rng.standard_normal(s) for s in shapes]
    comp = optgen.create(str(path), [p.copy() for p in params])
    ref = optgen.create(str(path), [p.copy() for p in params], backend="reference")
    products = [ln["matmul"] for ln in comp._param_kernel(0).launches
                if ln["kind"] == "matmul"]
    assert [m.get("round") for m in products] == [None, "bfloat16"], products
    assert (products[1]["alpha"], products[1]["beta"]) == ("c", None)
    for _ in range(3):
        grads = [rng.standard_normal(s) for s in shapes]
        comp.step([g.copy() for g in grads])
        ref.step([g.copy() for g in grads])
    for a, b in zip(comp.params, ref.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-15)
