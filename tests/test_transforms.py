"""optgen.transforms: each transform of a catalog rule against the hand-written spec where
one exists (cautious_adamw, mars_adamw, lamb, momentum's use_nesterov,
AdamWScheduleFree), against heavyball's or pytorch-optimizer's variant where one exists,
and against an oracle written here from the paper (numpy, float64, fed the same float32
inputs); compiled kernels against the reference interpreter; compositions; the typed
errors. Two compiled builds by default (a build takes seconds); every
transform's kernel is checked under --exhaustive."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import optgen
import optgen.torch
from helpers import assert_close, exhaustive
from optgen.core import catalog
from optgen.dsl import Spec
from optgen.transforms import (TransformError, cautious, ema, graft, lookahead, mars, nesterov,
                               orthogonalize, schedule_free, spec_file, trust_ratio)

SHAPES = [(6, 5), (7,)]
STEPS = 6
ADAMW = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)


def problem(seed, shapes=SHAPES, steps=STEPS):
    rng = np.random.default_rng(seed)
    w0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[(0.3 + rng.standard_normal(s)).astype(np.float32) for s in shapes]
             for _ in range(steps)]
    return w0, grads


def run(spec, backend, hypers, seed=0, steps=STEPS):
    """An optgen optimizer of ``spec`` (a transformed Spec or a catalog name) after
    ``steps`` steps of the problem ``seed``."""
    path = spec if isinstance(spec, str) else spec_file(spec)
    w0, grads = problem(seed, steps=steps)
    opt = optgen.create(path, [w.copy() for w in w0], backend=backend, **hypers)
    for gs in grads:
        opt.step([g.copy() for g in gs])
    return opt


def same(a, b, what, states=()):
    for i in range(len(SHAPES)):
        assert_close(a.params[i], b.params[i], "float32", f"{what}: w[{i}]")
        for s in states:
            sa, sb = (s, s) if isinstance(s, str) else s
            assert_close(a.state[i][sa], b.state[i][sb], "float32", f"{what}: {sa}[{i}]")


def against(opt, oracle, hypers, seed=0, steps=STEPS, what=""):
    """opt's parameters against ``oracle(w, grads, hypers)`` (float64) per parameter."""
    w0, grads = problem(seed, steps=steps)
    for i in range(len(SHAPES)):
        want = oracle(w0[i].astype(np.float64), [gs[i].astype(np.float64) for gs in grads],
                      hypers)
        assert_close(opt.params[i], want, "float32", f"{what} vs the paper's rule, w[{i}]")


# -- oracles from the papers ------------------------------------------------------------
def adamw_step(m, v, g, t, h):
    """torch.optim.AdamW's moments and its step lr * m_hat / (sqrt(v_hat) + eps)."""
    m = h["beta1"] * m + (1 - h["beta1"]) * g
    v = h["beta2"] * v + (1 - h["beta2"]) * g * g
    s = h["lr"] / (1 - h["beta1"] ** t) * m / (np.sqrt(v) / np.sqrt(1 - h["beta2"] ** t)
                                               + h["eps"])
    return m, v, s


def mars_c(g, last, h):
    """MARS (arXiv:2411.10438, Algorithm 2, approximate): the corrected, clipped gradient."""
    c = g + h["gamma"] * h["beta1"] / (1 - h["beta1"]) * (g - last)
    return c / max(np.linalg.norm(c), 1.0)


def oracle_cautious_mars(w, grads, h, use_mars=True, caution=True):
    m = v = last = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        c = mars_c(g, last, h) if use_mars else g
        last = g
        m, v, s = adamw_step(m, v, c, t, h)
        if caution:   # C-AdamW (arXiv:2411.16085, Algorithm 1): mask, rescale by its mean
            phi = (s * c > 0).astype(np.float64)
            s = s * phi / max(phi.mean(), 1e-3)
        w = w * (1 - h["lr"] * h["weight_decay"]) - s
    return w


def oracle_lamb(w, grads, h):
    """LAMB (arXiv:1904.00962, Algorithm 2) with bias correction."""
    m = v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m, v, s = adamw_step(m, v, g, t, h)
        r = s / h["lr"] + h["weight_decay"] * w
        nw, nr = np.linalg.norm(w), np.linalg.norm(r)
        w = w - h["lr"] * (nw / nr if nw > 0 and nr > 0 else 1.0) * r
    return w


def oracle_nadamw(w, grads, h):
    """AdamW reading beta1 * m_t + (1 - beta1) * g_t (Dozat 2016's look-ahead)."""
    m = v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m, v, _ = adamw_step(m, v, g, t, h)
        ahead = h["beta1"] * m + (1 - h["beta1"]) * g
        s = h["lr"] / (1 - h["beta1"] ** t) * ahead / (np.sqrt(v) / np.sqrt(1 - h["beta2"] ** t)
                                                       + h["eps"])
        w = w * (1 - h["lr"] * h["weight_decay"]) - s
    return w


def oracle_ema_sgd(w, grads, h):
    e = np.zeros_like(w)
    for g in grads:
        e = h["ema_beta"] * e + (1 - h["ema_beta"]) * g
        w = w - h["lr"] * e
    return w


def oracle_lookahead(w, grads, h):
    """Lookahead (arXiv:1907.08610, Algorithm 1) around AdamW."""
    m = v = np.zeros_like(w)
    slow = w.copy()
    for t, g in enumerate(grads, 1):
        m, v, s = adamw_step(m, v, g, t, h)
        w = w * (1 - h["lr"] * h["weight_decay"]) - s
        if t % h["lookahead_k"] == 0:
            slow = slow + h["lookahead_alpha"] * (w - slow)
            w = slow.copy()
    return w


def oracle_schedule_free(w, grads, h):
    """Schedule-Free AdamW (arXiv:2405.15682, Algorithm 1 with the authors' weighting and
    Adam's normalization): returns y after the steps."""
    z, x, v, wsum = w.copy(), w.copy(), np.zeros_like(w), 0.0
    y = w.copy()
    for t, g in enumerate(grads, 1):
        v = h["beta2"] * v + (1 - h["beta2"]) * g * g
        u = g / (np.sqrt(v / (1 - h["beta2"] ** t)) + h["eps"]) + h["weight_decay"] * y
        z = z - h["lr"] * u
        weight = h["lr"] ** 2
        wsum += weight
        x = (1 - weight / wsum) * x + weight / wsum * z
        y = (1 - h["beta1"]) * z + h["beta1"] * x
    return y


# -- compiled kernels: a composition, schedule-free's torch class -----------------------
def test_cautious_mars_adamw_kernel_reference_and_the_papers():
    h = dict(ADAMW, gamma=0.025)
    spec = cautious(mars("adamw"))
    comp, ref = run(spec, "compiled", h), run(spec, "reference", h)
    same(comp, ref, "compiled vs reference", ["m", "v", "last_grad"])
    against(comp, oracle_cautious_mars, h, what="cautious(mars(adamw))")


def test_lookahead_pytorch_optimizer_and_the_paper():
    from pytorch_optimizer import Lookahead
    h = dict(ADAMW, lookahead_k=3, lookahead_alpha=0.4)
    comp = run(lookahead("adamw"), "reference", h, steps=7)
    against(comp, oracle_lookahead, h, steps=7, what="lookahead(adamw)")
    w0, grads = problem(0, steps=7)
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in w0]
    base = torch.optim.AdamW(ps, lr=h["lr"], betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opt = Lookahead(base, k=3, alpha=0.4)
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
    for i, p in enumerate(ps):
        assert_close(comp.params[i], p.detach().numpy(), "float32", f"pytorch-optimizer w[{i}]")


def test_schedule_free_adamw_is_AdamWScheduleFree_with_train_and_eval():
    h = dict(lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, warmup_steps=2)
    classes = [optgen.torch.make(schedule_free("adamw")), optgen.torch.AdamWScheduleFree]
    assert issubclass(classes[0], optgen.torch.AdamWScheduleFree)
    w0, grads = problem(0)
    runs = []
    for cls, backend in zip(classes, ("compiled", "reference")):
        ps = [torch.nn.Parameter(torch.tensor(w)) for w in w0]
        opt = cls(ps, backend=backend, **h)
        opt.train()
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = torch.tensor(g)
            opt.step()
        y = [p.detach().clone().numpy() for p in ps]
        opt.eval()
        runs.append((y, [p.detach().clone().numpy() for p in ps], opt, ps))
    (y1, x1, o1, p1), (y2, x2, o2, p2) = runs
    for i in range(len(SHAPES)):
        assert_close(y1[i], y2[i], "float32", f"y[{i}]")
        assert_close(x1[i], x2[i], "float32", f"x[{i}] after eval()")
        assert_close(o1.state[p1[i]]["z"], o2.state[p2[i]]["z"], "float32", f"z[{i}]")
        assert_close(o1.state[p1[i]]["v"], o2.state[p2[i]]["exp_avg_sq"], "float32", f"v[{i}]")
    assert "m" not in o1.state[p1[0]]   # (the momentum the transform replaces is gone)
    with pytest.raises(RuntimeError, match="eval mode"):
        o1.step()


@pytest.mark.parametrize("use_mars", [False, True], ids=["caution", "mars+caution"])
def test_cautious_and_mars_equal_heavyballs_AdamW_flags(use_mars):
    """heavyball.AdamW(caution=True, mars=True): its MARS correction takes its arguments
    swapped (mars_correction(g, old, mars_gamma, beta1) computes the coefficient
    beta1 * mars_gamma / (1 - mars_gamma), the paper's gamma * beta1 / (1 - beta1) with
    the roles exchanged), and clips nothing: the same rule as ours at gamma =
    mars_gamma * (1 - beta1) / (1 - mars_gamma), with gradients small enough that
    ||c|| < 1. Its caution compares the step with the corrected gradient, as ours."""
    import heavyball
    import heavyball.utils
    heavyball.utils.compile_mode = None
    scale, mars_gamma = np.float32(0.01), 0.0025
    h = dict(ADAMW, gamma=mars_gamma * (1 - 0.9) / (1 - mars_gamma)) if use_mars else ADAMW
    spec = cautious(mars("adamw")) if use_mars else cautious("adamw")
    w0, grads = problem(0)
    ours = optgen.create(spec_file(spec), [w.copy() for w in w0], backend="reference", **h)
    ps = [torch.nn.Parameter(torch.tensor(w, dtype=torch.float64)) for w in w0]
    theirs = heavyball.AdamW(ps, lr=h["lr"], betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1,
                             caution=True, mars=use_mars, mars_gamma=mars_gamma)
    for gs in grads:
        ours.step([g * scale for g in gs])
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g * scale, dtype=torch.float64)
        theirs.step()
    for i, p in enumerate(ps):
        assert_close(ours.params[i], p.detach().numpy(), "float32", f"heavyball w[{i}]")


def test_the_caution_mask_pass_reads_what_the_sign_needs():
    """cautious(adamw)'s mean(phi) pass compares m_new * g, as cautious_adamw's: the
    step's positive divisor sqrt(v_hat) + eps is left out (no v read, no sqrt)."""
    from optgen.compiler.verify import verify
    from optgen.ir import walk
    for trace in verify(cautious("adamw")):
        passes = [n for n in walk(list(trace.updates.values())) if n.op == "reduce"]
        assert len(passes) == 1
        read = {n.name for n in walk([passes[0].args[0]]) if n.op in ("state", "grad")}
        assert read == {"m", "grad"}, read


# -- the transforms against the hand-written specs (reference interpreter) ----------------
def test_cautious_adamw_equals_cautious_adamw_and_the_paper():
    # the hand-written spec adds eps before the bias correction (transformers' form):
    # equal to float32 round-off at eps = 1e-8
    h = dict(ADAMW)
    got = run(cautious("adamw"), "reference", h)
    same(got, run("cautious_adamw", "reference", h), "cautious_adamw", ["m", "v"])
    against(got, lambda w, g, h: oracle_cautious_mars(w, g, h, use_mars=False), h,
            what="cautious(adamw)")


def test_mars_adamw_equals_mars_adamw_and_the_paper():
    h = dict(ADAMW, gamma=0.025)
    got = run(mars("adamw"), "reference", h)
    same(got, run("mars_adamw", "reference", dict(h, optimize_1d=True)), "mars_adamw",
         ["m", "v", "last_grad"])
    against(got, lambda w, g, h: oracle_cautious_mars(w, g, h, caution=False), h,
            what="mars(adamw)")


def test_trust_ratio_adamw_is_lamb():
    h = dict(ADAMW)
    got = run(trust_ratio("adamw"), "reference", h)
    same(got, run("lamb", "reference", h), "lamb", ["m", "v"])
    against(got, oracle_lamb, h, what="trust_ratio(adamw)")


def test_nesterov_momentum_is_use_nesterov_and_nadamw_the_look_ahead():
    h = dict(lr=0.05, momentum=0.8, weight_decay=0.01)
    got = run(nesterov("momentum"), "reference", h)
    same(got, run("momentum", "reference", dict(h, use_nesterov=True)), "momentum",
         ["moment"])
    against(run(nesterov("adamw"), "reference", ADAMW), oracle_nadamw, ADAMW,
            what="nesterov(adamw)")


def test_ema_and_graft_against_the_papers():
    h = dict(lr=0.05, ema_beta=0.8)
    against(run(ema("sgd"), "reference", h), oracle_ema_sgd, h, what="ema(sgd)")
    got = run(graft("adamw", "sgd"), "reference", ADAMW)

    def oracle(w, grads, h):
        """AdamW's direction at SGD's norm (arXiv:2002.11803, Algorithm 1, layer-wise);
        the rules share weight_decay: SGD's is coupled, lr * (g + weight_decay * w)."""
        m = v = np.zeros_like(w)
        for t, g in enumerate(grads, 1):
            m, v, s = adamw_step(m, v, g, t, h)
            d = s + h["lr"] * h["weight_decay"] * w
            d_m = h["lr"] * (g + h["weight_decay"] * w)
            w = w - np.linalg.norm(d_m) / np.linalg.norm(d) * d
        return w
    against(got, oracle, ADAMW, what="graft(adamw, sgd)")

    def oracle_lion(w, grads, h):
        """AdamW's direction at Lion's norm (arXiv:2302.06675): the rules share lr,
        beta1, beta2 and weight_decay; Lion's m is the state graft_m."""
        m = v = m_lion = np.zeros_like(w)
        for t, g in enumerate(grads, 1):
            m, v, s = adamw_step(m, v, g, t, h)
            d = s + h["lr"] * h["weight_decay"] * w
            c = h["beta1"] * m_lion + (1 - h["beta1"]) * g
            m_lion = h["beta2"] * m_lion + (1 - h["beta2"]) * g
            d_m = h["lr"] * (np.sign(c) + h["weight_decay"] * w)
            w = w - np.linalg.norm(d_m) / np.linalg.norm(d) * d
        return w
    got = run(graft("adamw", "lion"), "reference", ADAMW)
    against(got, oracle_lion, ADAMW, what="graft(adamw, lion)")
    assert sorted(got.state[0]) == ["graft_m", "m", "v"]


def test_schedule_free_against_the_paper():
    h = dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.0)
    against(run(schedule_free("adamw"), "reference", h), oracle_schedule_free, h,
            what="schedule_free(adamw)")


def newton_schulz(x, steps=5, a=3.4445, b=-4.7750, c=2.0315, eps=1e-7):
    """Muon's quintic Newton-Schulz iteration (Jordan et al. 2024), in float64."""
    x = x / max(np.linalg.norm(x), eps)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    for _ in range(steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def oracle_muon(w, grads, h, nesterov=False):
    """Muon on a 2-D parameter: heavy-ball momentum (the iteration normalizes, so its
    scale does not count), orthogonalized, scaled by sqrt(max(1, R / C))."""
    v = np.zeros_like(w)
    for g in grads:
        v = h["momentum"] * v + g
        u = g + h["momentum"] * v if nesterov else v
        w = w - h["lr"] * np.sqrt(max(1.0, w.shape[0] / w.shape[1])) * newton_schulz(u)
    return w


@pytest.mark.parametrize("use_nesterov", [False, True], ids=["momentum", "nesterov"])
def test_orthogonalize_momentum_is_muon_and_the_paper(use_nesterov):
    h = dict(lr=0.02, momentum=0.9)
    spec = orthogonalize(nesterov("momentum") if use_nesterov else "momentum")
    got = run(spec, "reference", h)
    muon = run("muon", "reference", dict(h, nesterov=use_nesterov, weight_decay=0.0))
    assert_close(got.params[0], muon.params[0], "float32", "2-D w vs muon")
    w0, grads = problem(0)
    want = oracle_muon(w0[0].astype(np.float64), [gs[0].astype(np.float64) for gs in grads],
                       h, use_nesterov)
    assert_close(got.params[0], want, "float32", "2-D w vs the paper's rule")
    # (1-D parameters: the base rule, heavy-ball momentum)
    v, w = np.zeros(SHAPES[1]), w0[1].astype(np.float64)
    for gs in grads:
        v = h["momentum"] * v + gs[1]
        w = w - h["lr"] * ((gs[1] + h["momentum"] * v) if use_nesterov else v)
    assert_close(got.params[1], w, "float32", "1-D w vs momentum")


# -- what each transform accepts ---------------------------------------------------------
def _in_memory():
    spec = Spec("inline", "a spec built in memory")
    lr = spec.hyper("lr", 0.1, "lr >= 0")

    @spec.update
    def rule(w, grad, flags):
        return {w: w - lr * grad}
    return spec


ERRORS = [
    (lambda: mars("adagrad"), TransformError, r"mars needs a rule with a first moment.*adagrad"),
    (lambda: schedule_free("lion"), TransformError,
     r"schedule_free needs a rule with a first moment.*lion has none"),
    (lambda: cautious("ftrl"), TransformError, r"cautious needs a rule whose new w is w.*ftrl"),
    (lambda: mars(mars("adamw")), TransformError, r"mars declares hyperparameter 'gamma'.*"
     r"mars_adamw already has"),
    (lambda: cautious(_in_memory()), TransformError, r"'inline' was not loaded from a file"),
    (lambda: cautious(42), TypeError, r"cautious: expected a Spec.*int 42"),
    (lambda: optgen.torch.make(cautious("adamw"), base="sgd"), TypeError, r"base= applies"),
    (lambda: orthogonalize("muon"), TransformError, r"orthogonalize takes elementwise rules; "
     r"muon multiplies matrices"),
    (lambda: cautious("lazyadam"), TransformError, r"cautious reduces over the whole parameter "
     r"tensor; lazyadam updates only the rows"),
    (lambda: orthogonalize("adagrad"), TransformError, r"orthogonalize needs a rule with a "
     r"first moment"),
]


@pytest.mark.parametrize("call, error, message", ERRORS,
                         ids=["mars-no-moment", "sf-no-moment", "cautious-form", "twice",
                              "in-memory", "not-a-spec", "make-base", "matrix", "lazy",
                              "ortho-no-moment"])
def test_a_rule_a_transform_does_not_accept_is_a_typed_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


TRANSFORMS = {"cautious": cautious, "mars": mars, "ema": ema, "nesterov": nesterov,
              "trust_ratio": trust_ratio, "schedule_free": schedule_free,
              "lookahead": lookahead, "orthogonalize": orthogonalize,
              "graft": lambda s: graft(s, "sgd")}
SAMPLE = ("torch_adamw", "lion", "sgd", "ftrl", "soap")


def catalog_names(config):
    return sorted(catalog.list_specs()) if exhaustive(config) else list(SAMPLE)


def doc_table() -> dict[str, list[str]]:
    """docs/transforms.md's table: catalog rule -> the transforms it lists as taking it."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "transforms.md").read_text()
    rows = [line.strip("|").split("|") for line in text.splitlines()
            if line.startswith("| ") and line.count("|") == len(TRANSFORMS) + 2]
    head = [c.strip().split("(")[0] for c in rows[0][1:]]
    assert head == list(TRANSFORMS), head
    return {r[0].strip(): [t for t, c in zip(head, r[1:]) if c.strip() == "yes"]
            for r in rows[1:] if not r[0].startswith("---")}


def test_every_transform_of_a_catalog_rule_is_a_spec_or_a_transform_error(pytestconfig):
    """Over the catalog (a sample unless --exhaustive): a transform gives a verified spec
    or refuses with TransformError, never another error, as docs/transforms.md says."""
    table = doc_table()
    assert sorted(table) == sorted(catalog.list_specs())
    for name in catalog_names(pytestconfig):
        taken = []
        for t, transform in TRANSFORMS.items():
            try:
                transform(name)
                taken.append(t)
            except TransformError:
                pass
        assert taken == table[name], f"{name}: docs/transforms.md lists {table[name]}"


# -- every transform's kernel (exhaustive) -------------------------------------------------
EVERY = {"cautious": (lambda: cautious("adamw"), ADAMW),
         "mars": (lambda: mars("adamw"), dict(ADAMW, gamma=0.025)),
         "trust_ratio": (lambda: trust_ratio("adamw"), ADAMW),
         "nesterov": (lambda: nesterov("adamw"), ADAMW),
         "ema": (lambda: ema("sgd"), dict(lr=0.05, ema_beta=0.8)),
         "graft": (lambda: graft("adamw", "sgd"), ADAMW),
         "schedule_free": (lambda: schedule_free("adamw"), dict(lr=0.01, weight_decay=0.1)),
         "lookahead": (lambda: lookahead("adamw"), dict(ADAMW, lookahead_k=2)),
         "orthogonalize": (lambda: orthogonalize("momentum"), dict(lr=0.02, momentum=0.9))}


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", sorted(EVERY))
def test_every_transform_kernel_matches_the_reference(name):
    make, h = EVERY[name]
    spec = make()
    same(run(spec, "compiled", h), run(spec, "reference", h), name)
