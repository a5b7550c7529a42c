"""The torch_* specs against torch.optim itself: 20 steps of optgen.create("torch_<name>")
(numpy, llvm kernels) and of the real torch.optim optimizer (foreach off: its single-tensor
path) on the same gradients, for a few shapes, float32 and float64, and every flag.

The parameter and every state torch keeps must agree within 1e-5 (float32) or 1e-10
(float64) of the largest absolute value. torch's keyword arguments are translated to the
spec's hyperparameters as docs/torch-forms.md says (betas -> beta1, beta2, ...).
"""
import numpy as np
import pytest

import optgen

torch = pytest.importorskip("torch", reason="torch is not installed")

SHAPES = [0, 1, 17, 255, (33, 31)]
MATRICES = [(33, 31), (12, 40)]
TOL = {"float32": 1e-5, "float64": 1e-10}
SPLIT = {"betas": ("beta1", "beta2"), "etas": ("etaminus", "etaplus"),
         "step_sizes": ("step_size_min", "step_size_max"),
         "ns_coefficients": ("ns_a", "ns_b", "ns_c")}
ACCEPTED = ("foreach",)   # torch arguments with no optgen counterpart (always fused)

# spec -> (torch class, [torch keyword arguments]): each config runs on every shape and dtype
CONFIGS = {
    "adam": ("Adam", [{}, {"lr": 0.01, "betas": (0.8, 0.9), "weight_decay": 0.1},
                      {"amsgrad": True, "maximize": True, "weight_decay": 0.05},
                      {"decoupled_weight_decay": True, "weight_decay": 0.1, "amsgrad": True},
                      {"decoupled_weight_decay": True, "maximize": True, "eps": 0.0}]),
    "adamw": ("AdamW", [{}, {"lr": 0.01, "amsgrad": True, "weight_decay": 0.3},
                        {"maximize": True, "betas": (0.5, 0.7)}]),
    "sgd": ("SGD", [{}, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
                    {"momentum": 0.5, "dampening": 0.3, "maximize": True},
                    {"lr": 0.05, "momentum": 0.9, "nesterov": True, "maximize": True}]),
    "adagrad": ("Adagrad", [{}, {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1,
                                 "initial_accumulator_value": 0.3, "eps": 1e-6},
                            {"maximize": True, "lr_decay": 0.5}]),
    "rmsprop": ("RMSprop", [{}, {"centered": True, "momentum": 0.9, "weight_decay": 0.1},
                            {"alpha": 0.5, "eps": 1e-3, "maximize": True, "momentum": 0.3},
                            {"centered": True, "maximize": True, "lr": 1e-3}]),
    "adadelta": ("Adadelta", [{}, {"lr": 0.5, "rho": 0.5, "weight_decay": 0.1, "eps": 1e-3},
                              {"maximize": True}]),
    "adamax": ("Adamax", [{}, {"lr": 0.01, "betas": (0.5, 0.8), "weight_decay": 0.1},
                          {"maximize": True, "eps": 0.0}]),
    "nadam": ("NAdam", [{}, {"lr": 0.01, "weight_decay": 0.1, "momentum_decay": 0.01},
                        {"decoupled_weight_decay": True, "weight_decay": 0.1, "maximize": True}]),
    # rho_t passes 5 within the 20 steps: both branches of the rectification switch run
    "radam": ("RAdam", [{}, {"lr": 0.01, "betas": (0.5, 0.9), "weight_decay": 0.1},
                        {"decoupled_weight_decay": True, "weight_decay": 0.1,
                         "maximize": True}]),
    "asgd": ("ASGD", [{}, {"lr": 0.05, "lambd": 1e-2, "alpha": 0.5, "t0": 5.0,
                           "weight_decay": 0.1},
                      {"maximize": True, "t0": 0.0}]),
    "rprop": ("Rprop", [{}, {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.1)},
                        {"maximize": True}]),
}
# torch.optim.Adafactor divides by sqrt(numel): an empty parameter is a ZeroDivisionError
ADAFACTOR = ("Adafactor", [{}, {"lr": 0.05, "beta2_decay": -0.5, "d": 1.5,
                                "weight_decay": 0.1, "maximize": True},
                           {"eps": (1e-3, 1e-2), "lr": 0.5}])



def optgen_hypers(name: str, kw: dict) -> dict:
    """torch's keyword arguments as the spec's hyperparameters (docs/torch-forms.md)."""
    out = {}
    for k, v in kw.items():
        if k in SPLIT:
            out.update(zip(SPLIT[k], v))
        elif name == "adafactor" and k == "eps":
            out["eps1"], out["eps2"] = v
        elif k == "adjust_lr_fn":
            out["match_rms_adamw"] = v == "match_rms_adamw"
        elif k not in ACCEPTED:
            out[k] = v
    return out


def assert_near(actual, expected, dtype, what, floor=1e-30):
    """Within TOL of max|expected| (at least ``floor``: states, whose terms are of the
    gradients' size 1 even where they cancel to a small value)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(float(np.max(np.abs(expected), initial=0.0)), floor)
    np.testing.assert_allclose(actual.reshape(expected.shape), expected, rtol=0,
                               atol=TOL[dtype] * scale, err_msg=what)


@pytest.fixture(autouse=True)
def torch_scalars_in_float64():
    """torch keeps per-parameter scalars (NAdam's mu_product, ASGD's eta and mu) in the
    default dtype, float32 unless set: float64 here, as optgen's host scalars (float32
    parameters are compared at 1e-5, far above float32 scalars' rounding)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def compare(name, cls, kw, shape, dtype, *, steps=20, grad=None, seed=0, extra=None):
    """Run torch.optim.<cls>(**kw) and optgen's torch_<name> (with the spec's hypers
    ``extra`` besides kw's) side by side."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(shape).astype(dtype)
    p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
    ref = getattr(torch.optim, cls)([p], **kw)
    w = w0.copy()
    opt = optgen.create(f"torch_{name}", [w], **optgen_hypers(name, kw), **(extra or {}))
    for k in range(steps):
        g = (grad or (lambda r, s, d, k: r.standard_normal(s).astype(d)))(rng, shape, dtype, k)
        p.grad = torch.from_numpy(g.copy())
        ref.step()
        opt.step([g])
    what = f"torch_{name} {kw} shape {shape} {dtype}"
    assert_near(w, p.detach().numpy(), dtype, f"{what}: w")
    for key, value in ref.state[p].items():
        if key == "step" or value is None:
            continue
        assert key in opt.state[0], f"{what}: torch state {key} missing"
        assert_near(opt.state[0][key], value.detach().numpy(), dtype, f"{what}: {key}",
                    floor=1.0)
    return opt, ref


def cases(table):
    for name, (cls, configs) in table.items():
        for i, kw in enumerate(configs):
            yield pytest.param(name, cls, kw, id=f"{name}-{i}")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,cls,kw", list(cases(CONFIGS)))
def test_matches_torch(name, cls, kw, dtype):
    for shape in SHAPES:
        compare(name, cls, {"foreach": False, **kw}, shape, dtype)


def test_sgd_momentum_switched_on_later_starts_from_g():
    """torch creates the buffer as a copy of g on the first step with momentum != 0."""
    w, p = np.ones(5), torch.nn.Parameter(torch.ones(5, dtype=torch.float64))
    ref = torch.optim.SGD([p], lr=0.1)
    opt = optgen.create("torch_sgd", [w], lr=0.1)
    rng = np.random.default_rng(1)
    for k in range(6):
        if k == 3:
            ref.param_groups[0]["momentum"] = 0.9
            opt.set_hyper(momentum=0.9)
        g = rng.standard_normal(5)
        p.grad = torch.from_numpy(g.copy())
        ref.step()
        opt.step([g])
    assert_near(w, p.detach().numpy(), "float64", "w")
    assert_near(opt.state[0]["momentum_buffer"], ref.state[p]["momentum_buffer"].numpy(),
                "float64", "momentum_buffer")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("i", range(len(ADAFACTOR[1])))
def test_adafactor_matches_torch(i, dtype):
    """torch's eps1 None is finfo(dtype).eps: the spec's None is float32's, and float64
    gets finfo(float64).eps passed explicitly, as the drop-in does (docs/torch-forms.md)."""
    kw = {"foreach": False, **ADAFACTOR[1][i]}
    extra = {"eps1": float(np.finfo(np.float64).eps)} \
        if dtype == "float64" and "eps" not in kw else {}
    for shape in [1, 17, 255, (33, 31), (3, 5, 7)]:
        compare("adafactor", ADAFACTOR[0], kw, shape, dtype, extra=extra)


def test_adafactor_zero_gradient_rows_hit_the_eps1_bounds():
    """A zero gradient makes torch clamp the variance estimate at eps1**2 (and the row
    mean at eps1): the update is 0 * rsqrt(eps1**2), not NaN."""
    kw = {"eps": (1e-6, 1e-3), "lr": 0.1}
    grad = lambda rng, shape, dtype, k: np.where(  # noqa: E731
        np.arange(np.prod(shape)).reshape(shape) % 3 == 0, 0.0,
        rng.standard_normal(shape)).astype(dtype) * (k % 4 != 0)
    for shape in [17, (9, 6)]:
        compare("adafactor", "Adafactor", kw, shape, "float64", grad=grad)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("maximize", [False, True])
def test_sparseadam_matches_torch(maximize, dtype):
    """Row-sparse gradients (duplicate rows included) through the lazy kernels, against
    torch.optim.SparseAdam on the same sparse COO gradients."""
    rng = np.random.default_rng(3)
    kw = {"lr": 0.01, "betas": (0.8, 0.95), "maximize": maximize}
    for shape in [1, 17, (33, 31)]:
        w0 = rng.standard_normal(shape).astype(dtype)
        p = torch.nn.Parameter(torch.from_numpy(w0.copy()))
        ref = torch.optim.SparseAdam([p], **kw)
        w = w0.copy()
        opt = optgen.create("torch_sparseadam", [w], **optgen_hypers("sparseadam", kw))
        rows = w.shape[0]
        for _ in range(20):
            idx = rng.integers(0, rows, size=max(1, rows // 2))
            vals = rng.standard_normal((len(idx),) + w.shape[1:]).astype(dtype)
            p.grad = torch.sparse_coo_tensor(torch.from_numpy(idx)[None],
                                             torch.from_numpy(vals.copy()), w.shape,
                                             check_invariants=True)
            ref.step()
            opt.step([optgen.RowSparse(idx, vals)])
        what = f"sparseadam {kw} {shape} {dtype}"
        assert_near(w, p.detach().numpy(), dtype, f"{what}: w")
        for key in ("exp_avg", "exp_avg_sq"):
            assert_near(opt.state[0][key], ref.state[p][key].numpy(), dtype, f"{what}: {key}",
                        floor=1.0)
