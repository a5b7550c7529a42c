"""clip_global_norm on the kernels: the norm of large finite float32 gradients (their
squares overflow float32: the sum-of-squares pass takes such a gradient again, scaled),
and prebuilt artifacts stepping with it without compiling anything (``optgen build
--out`` ships the sum-of-squares kernels inside the artifact)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optgen
from optgen.runtime import tensors
from test_prebuilt import _tvm_without_compiler


def _clipped_sgd(ws, gs, lr, max_norm):
    """The float64 oracle: torch's clip coefficient on the float64 norm, then SGD."""
    norm = float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in gs)))
    coef = min(1.0, max_norm / (norm + 1e-6))
    return norm, [(w.astype(np.float64) - lr * coef * g.astype(np.float64)) for w, g in zip(ws, gs)]


@pytest.mark.parametrize("scale", [1e20, 3e38])
def test_finite_float32_gradients_whose_squares_overflow_clip_to_max_norm(monkeypatch, scale):
    """Finite float32 gradients up to the largest float32: their squares overflow float32
    (the kernel's dtype) but not float64; the norm is the float64 one and the step the
    clipped one. (Squares formed in float32 alone: norm inf, coefficient 0, no move.)
    The kernels compute it (the array library's float64 pass would raise here)."""
    def refused(*args):
        raise AssertionError("clip_global_norm read the gradients outside the kernels")

    monkeypatch.setattr(tensors, "sum_of_squares", refused)
    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(n).astype(np.float32) for n in (37, 1000)]
    gs = [(rng.uniform(-1, 1, n) * scale).astype(np.float32) for n in (37, 1000)]
    gs[0][:5] = [1e-30, -2.0, 0.0, 1e5, -1e19]        # small values beside the large ones
    want_norm, want = _clipped_sgd(ws, gs, 0.5, 1.0)
    opt = optgen.create("sgd", ws, lr=0.5, clip_global_norm=1.0)
    opt.step(gs)
    assert np.isfinite(opt.last_grad_norm)
    np.testing.assert_allclose(opt.last_grad_norm, want_norm, rtol=1e-6)
    for w, v in zip(ws, want):
        np.testing.assert_allclose(w, v, rtol=1e-5, atol=1e-6)
    assert max(float(np.abs(w - v0).max()) for w, v0 in zip(ws, want)) < 1.0


def test_a_non_finite_gradient_still_skips_after_the_scaled_pass():
    ws = [np.ones(64, np.float32), np.ones(8, np.float32)]
    gs = [np.full(64, 1e20, np.float32), np.ones(8, np.float32)]
    gs[0][3] = np.inf
    opt = optgen.create("sgd", ws, lr=0.5, clip_global_norm=1.0, nonfinite="skip")
    assert opt.step(gs) is False and opt.skipped_steps == 1
    assert all((w == 1).all() for w in ws)


def test_torch_form_clips_large_finite_gradients_where_torch_gives_inf():
    """torch.nn.utils.clip_grad_norm_ forms float32 squares: 1e20 gradients give an
    infinite norm and zero gradients (torch.optim.SGD then does not move). optgen's
    norm is the float64 one: the step moves the weights by lr * max_norm along g."""
    torch = pytest.importorskip("torch")
    import optgen.torch as ot
    p, q = (torch.nn.Parameter(torch.zeros(100)) for _ in range(2))
    p.grad, q.grad = (torch.full((100,), 1e20) for _ in range(2))
    assert torch.nn.utils.clip_grad_norm_([q], 1.0) == float("inf")
    assert torch.equal(q.grad, torch.zeros(100))
    opt = ot.SGD([p], lr=0.5, clip_global_norm=1.0)
    opt.step()
    np.testing.assert_allclose(p.detach().numpy(), np.full(100, -0.5 / 10.0), rtol=1e-6)


def test_prebuilt_artifact_clips_without_compiling(tmp_path):
    """``optgen.build(..., out=)`` ships the sum-of-squares kernels inside the artifact:
    ``optgen.load`` of it steps with clip_global_norm in a process whose TVM has no
    compiler library, on those kernels (the array library's pass refused), compiling
    nothing into its (empty) cache; without the shipped folder it takes the array
    library's float64 pass, still compiling nothing. (Before: the pass was compiled into
    the cache: VariantNotBuilt "cannot be built here" without the compiler.)"""
    r = optgen.build("sgd", out=str(tmp_path / "out"))
    shipped = os.path.join(r.path, "_sum_of_squares")
    assert optgen.Artifact.load(shipped).name == "sum_of_squares"
    script = textwrap.dedent("""
        import os, sys, numpy as np, optgen
        from optgen.runtime import tensors
        if sys.argv[2] == "kernels":
            def refused(*args):
                raise AssertionError("the array library's pass ran")
            tensors.sum_of_squares = refused
        w = [np.linspace(-1, 1, 300).astype(np.float32), np.ones(7, np.float32)]
        opt = optgen.create(optgen.load(sys.argv[1]), w, lr=0.5, clip_global_norm=1.0)
        opt.step([np.full(300, 1e20, np.float32), np.zeros(7, np.float32)])
        print(repr(opt.last_grad_norm), repr(float(w[0][0])),
              sorted(os.listdir(os.environ["OPTGEN_CACHE_DIR"])))
    """)
    env = dict(os.environ, OPTGEN_CACHE_DIR=str(tmp_path / "empty-cache"),
               PYTHONPATH=os.pathsep.join([_tvm_without_compiler(tmp_path),
                                           os.environ.get("PYTHONPATH", "")]))
    os.makedirs(env["OPTGEN_CACHE_DIR"])
    want = (float(np.sqrt(300.0)) * 1e20, -1.0 - 0.5 / np.sqrt(300.0))
    for mode in ("kernels", "array library"):
        if mode != "kernels":
            import shutil
            shutil.rmtree(shipped)
        run = subprocess.run([sys.executable, "-c", script, r.path, mode], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, (mode, run.stderr[-2000:])
        norm, w0, cache = run.stdout.split(" ", 2)
        np.testing.assert_allclose([float(norm), float(w0)], want, rtol=1e-6)
        assert cache.strip() == "[]", (mode, cache)
