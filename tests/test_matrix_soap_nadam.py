"""SOAP-NAdam (specs/soap_nadam.py, optgen.torch.SOAPNAdam) against an oracle written here
from the published rules, SOAP's (soap_oracle.py: its statistics, basis and order of
operations) with Adam's step replaced by NAdam's (Dozat 2016, as torch.optim.NAdam
computes it: the momentum schedule mu_t and its running product), and against
heavyball 3.2.1's SOAPNAdam (eager), on test_matrix_soap's regression problem (every
eigenbasis well determined).

heavyball refreshes its basis after its step counts f, 2f, ... and SOAP after every f
Adam steps (one step later); with f = 1 both refresh after every step and the runs
agree up to heavyball's shift of each power iteration (1e-8 of the largest eigenvalue
in float64) and rounding. Measured, seeds 0-2, 12 steps, float64: weights within
4.9e-8 of max|w| (the tolerance is 2e-7); with SOAP's authors' decay order (after the
step) or torch NAdam's sqrt(v_hat) + eps in place of heavyball's, 6e-6 to 7e-5 apart.
"""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import optgen
import optgen.torch
from helpers import load_example
from soap_oracle import SoapOracle

# both sides, none (NAdam), and the right only (a side over 2048 keeps Q = I): three of
# the four kernels (the left-only one mirrors the right-only one; test_matrix_soap's
# shapes cover it for SOAP's statistics); all float64, so that the file builds one library
SHAPES = [(8, 8), (6,), (2049, 3)]
BENCH = load_example("soap_vs_authors", folder="bench")


def regression(seed: int, dtype: str, steps: int):
    w0, batches = BENCH.regression_data(seed, steps, SHAPES, dtype)

    def grads(ws, t):
        return [BENCH.gradient(w, b).astype(dtype) for w, b in zip(ws, batches[t - 1])]
    return w0, grads


def worst(actual, expected) -> float:
    expected = np.asarray(expected, np.float64)
    return float(np.max(np.abs(np.asarray(actual, np.float64) - expected))
                 / np.max(np.abs(expected)))


class SoapNAdamOracle(SoapOracle):
    """SOAP with NAdam in the eigenbasis, per parameter, per call of step() (k = 1, 2, ...):

    k = 1:  SOAP's first step (fit the basis; nothing else changes); mu_product = 1.
    k > 1:  t = k - 1;  g' = project(g)
            mu_t = b1 (1 - 0.5 * 0.96^(t md));  mu_next = b1 (1 - 0.5 * 0.96^((t + 1) md))
            mu_product = mu_product * mu_t
            m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2
            d = max(sqrt(v / (1 - b2^t)), eps)                     (heavyball's denominator)
            N = project_back((1 - mu_t) / (1 - mu_product) g' / d
                             + mu_next / (1 - mu_product mu_next) m / d)
            W = W (1 - lr wd) - lr N                              (heavyball's decay)
            then SOAP's statistics update and refresh (every f-th t), m moved with the basis.
    """

    def __init__(self, params0, lr=3e-3, betas=(0.9, 0.999), shampoo_beta=0.95, eps=1e-8,
                 weight_decay=0.01, precondition_frequency=2, max_precond_dim=2048,
                 momentum_decay=4e-3):
        super().__init__(params0, lr=lr, betas=betas, shampoo_beta=shampoo_beta, eps=eps,
                         weight_decay=weight_decay,
                         precondition_frequency=precondition_frequency,
                         max_precond_dim=max_precond_dim)
        self.md = momentum_decay

    def step(self, grads) -> None:
        b1, b2 = self.b1, self.b2
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            st = self.st[i]
            if st is None:
                sides = g.shape if g.ndim == 2 else ()
                st = self.st[i] = {
                    "t": 0, "m": np.zeros_like(g), "v": np.zeros_like(g), "mu_product": 1.0,
                    "GG": [np.zeros((n, n)) if n <= self.max_dim else None for n in sides]}
                self.accumulate(st, g)
                st["Q"] = [None if gg is None else self.fit(gg) for gg in st["GG"]]
                continue
            st["t"] += 1
            t, Q = st["t"], st["Q"]
            g_rot = self.project(g, Q)
            mu = b1 * (1 - 0.5 * 0.96 ** (t * self.md))
            mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * self.md))
            st["mu_product"] *= mu
            prod = st["mu_product"]
            st["m"] = b1 * st["m"] + (1 - b1) * g_rot
            st["v"] = b2 * st["v"] + (1 - b2) * g_rot * g_rot
            d = np.maximum(np.sqrt(st["v"] / (1 - b2 ** t)), self.eps)
            n = (1 - mu) / (1 - prod) * g_rot / d + mu_next / (1 - prod * mu_next) * st["m"] / d
            self.w[i] = (self.w[i] * (1 - self.lr * self.wd)
                         - self.lr * self.project(n, Q, back=True))
            st["m"] = self.project(st["m"], Q, back=True)
            self.accumulate(st, g)
            if t % self.f == 0:
                self.power_iteration(st)
            st["m"] = self.project(st["m"], st["Q"])


CASES = {
    "defaults": {},
    "f3-wd": dict(precondition_frequency=3, shampoo_beta=-1.0, weight_decay=0.1, lr=0.01,
                  momentum_decay=0.05, betas=(0.8, 0.95)),
}


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("case", list(CASES))
def test_soap_nadam_matches_the_oracle_in_float64(case, backend):
    """The catalog form, both backends, float64, 12 steps: w within 1e-10 of max|w| at
    every step; at the end mu_product, v and |m| (the basis's column signs are free)."""
    hyper = dict(CASES[case])
    w0, grads = regression(1, "float64", 12)
    params = [w.copy() for w in w0]
    betas = hyper.pop("betas", None)
    spec_hyper = {**hyper, **({} if betas is None else dict(beta1=betas[0], beta2=betas[1]))}
    opt = optgen.create("soap_nadam", params, backend=backend, **spec_hyper)
    oracle = SoapNAdamOracle(w0, **hyper, **({} if betas is None else dict(betas=betas)))
    for t in range(1, 13):
        gs = grads(oracle.w, t)
        opt.step(gs)
        oracle.step(gs)
        for i in range(len(SHAPES)):
            err = worst(params[i], oracle.w[i])
            assert err <= 1e-10, f"{case} step {t} parameter {i} {SHAPES[i]}: {err:.2e}"
    assert min(oracle.gaps) >= 1e-5, "the problem's eigenbasis is not well determined"
    for i in range(len(SHAPES)):
        st = opt.state[i]
        assert abs(float(st["mu_product"]) - oracle.st[i]["mu_product"]) <= 1e-14
        assert worst(st["v"], oracle.st[i]["v"]) <= 1e-9, f"v of parameter {i}"
        assert worst(np.abs(st["m"]), np.abs(oracle.st[i]["m"])) <= 1e-9, f"m of {i}"


def _heavyball():
    heavyball = pytest.importorskip("heavyball", reason="heavyball is not installed")
    import heavyball.utils
    heavyball.utils.compile_mode = None           # (eager: its compile takes minutes)
    heavyball.utils.compile_mode_recommended_to_none = None
    return heavyball


def test_soap_nadam_follows_heavyballs_soap_nadam():
    """heavyball.SOAPNAdam and optgen.torch.SOAPNAdam, float64, both refreshing after
    every step, 12 steps with non-default hyperparameters: weights within 2e-7 of max|w|
    at every step (heavyball keeps m and v in its own layout; not compared)."""
    hb = _heavyball()
    hyper = dict(lr=1e-2, betas=(0.85, 0.99), shampoo_beta=0.9, weight_decay=0.05,
                 precondition_frequency=1, momentum_decay=0.02)
    w0, grads = regression(0, "float64", 12)
    mine = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in w0]
    theirs = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in w0]
    opt = optgen.torch.SOAPNAdam(mine, **hyper)
    ref = hb.SOAPNAdam(theirs, **hyper, storage_dtype="float64")
    for t in range(1, 13):
        gs = grads([p.detach().numpy() for p in theirs], t)
        for a, b, g in zip(mine, theirs, gs):
            a.grad, b.grad = torch.from_numpy(g), torch.from_numpy(g.copy())
        opt.step()
        ref.step()
        for i, (a, b) in enumerate(zip(mine, theirs)):
            err = worst(a.detach().numpy(), b.detach().numpy())
            assert err <= 2e-7, f"step {t} parameter {i} {SHAPES[i]}: {err:.2e}"


def _effective(default, hb):
    """heavyball's ``use_default`` sentinel read as the value its classes then take."""
    return {"palm": False, "use_precond_schedule": False, "gradient_clipping": None,
            "update_clipping": None, "compile_step": False, "promote": False}.get(
                default[0], default[1]) if default[1] is hb.utils.use_default else default[1]


def test_torch_soap_nadam_has_heavyballs_signature():
    """Every parameter of heavyball.SOAPNAdam, in its order, with its default (its
    ``use_default`` sentinels read as the values they stand for)."""
    hb = _heavyball()

    def params(cls):
        return [(n, p.default) for n, p in inspect.signature(cls.__init__).parameters.items()
                if n not in ("self", "params") and p.kind is not p.VAR_KEYWORD]
    theirs = [(n, _effective((n, d), hb)) for n, d in params(hb.SOAPNAdam)]
    assert params(optgen.torch.SOAPNAdam) == theirs
    opt = optgen.torch.SOAPNAdam([torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.float64))])
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.999) and group["precondition_frequency"] == 2
    assert group["shampoo_beta"] == 0.95 and group["max_precond_dim"] == 2048
    assert optgen.torch.make("soap_nadam") is optgen.torch.SOAPNAdam


REFUSED = [
    (dict(mars=True), r"SOAPNAdam: mars=True is not built \(mars=False\)"),
    (dict(caution=True), r"caution=True is not built"),
    (dict(warmup_steps=10), r"warmup_steps=10 is not built \(warmup_steps=0\)"),
    (dict(storage_dtype="bfloat16"), r"storage_dtype='bfloat16' is not built"),
    (dict(precondition_1d=True), r"precondition_1d=True is not built"),
    (dict(gradient_clipping=abs), r"gradient_clipping=<built-in function abs> is not built"),
    (dict(precondition_frequency=0), r"precondition_frequency"),
    (dict(conv=True), r"SOAPNAdam: a parameter of shape \(4, 3, 3, 3\) has 4 dimensions"),
]


@pytest.mark.parametrize("kwargs,message", REFUSED)
def test_torch_soap_nadam_refuses_what_is_not_built(kwargs, message):
    params = [torch.nn.Parameter(torch.ones(3, 4))]
    if kwargs.pop("conv", False):
        params.append(torch.nn.Parameter(torch.ones(4, 3, 3, 3)))
    with pytest.raises(ValueError, match=message):
        optgen.torch.SOAPNAdam(params, **kwargs)
    assert all(float(p.detach().sum()) == p.numel() for p in params)


def test_soap_nadam_refreshes_in_soaps_dtype():
    """SOAP-NAdam's basis refresh is SOAP's, precision included: the kernel's dtype
    (float32 for float32 weights, as SOAP's authors run it), not the float64 default."""
    from optgen.compiler.loader import load_spec
    from optgen.core import catalog
    soap, nadam = (load_spec(catalog.resolve(n)) for n in ("soap", "soap_nadam"))
    assert soap.refresh_rule.dtype == "kernel"
    assert nadam.refresh_rule.dtype == soap.refresh_rule.dtype
    assert nadam.refresh_rule.rule.__code__.co_filename == soap.refresh_rule.rule.__code__.co_filename
