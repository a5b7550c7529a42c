"""Every spec file of specs/ and examples/specs/ through ``optgen.torch.make(path)``, as a
user takes it: constructed with no arguments and with every hyperparameter set to a
valid value off its default, stepped, scheduled (torch.optim.lr_scheduler.StepLR) and
checkpointed (state_dict through torch.save, load_state_dict into a fresh optimizer on
the same parameters, then equal continued steps, bit for bit).

A spec joins by being a file there. Spec-specific needs are met here, not skipped: 2-D
parameters only where the torch form refuses others (torch_muon), row-sparse gradients
for SparseAdam, the extra inputs a spec declares (SVRG's snapshot gradients) and the
statistics of a refresh rule (THOR's A and G) on the steps that refresh.

Small on purpose (a 4x3 weight and a bias, a few steps): the kernels are built once per
spec (llvm, shared through the session's artifact cache with the other tests).
"""
from __future__ import annotations

import glob
import inspect
import io
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import optgen.torch as otorch  # noqa: E402
from helpers import family_sampled  # noqa: E402
from optgen.core import hyper as hyper_rules  # noqa: E402
from optgen.runtime import get_artifact  # noqa: E402
from optgen.torch.optim_form import SPLIT, TorchForm  # noqa: E402
from optgen.runtime.hyper_names import tuple_names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECS = sorted(p for folder in ("specs", "examples/specs")
               for p in glob.glob(os.path.join(ROOT, folder, "*.py"))
               if not os.path.basename(p).startswith("_"))
STEPS = 2           # before the checkpoint, and again after it


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def non_default(art) -> dict:
    """Every hyperparameter of ``art`` off its default, flags flipped: the busy setting
    of optgen check (optgen.core.hyper.busy_hypers), which moves one back only where a
    requirement forbids the mix."""
    flags = {n: not h.default for n, h in art.hypers.items() if h.is_flag}
    values = hyper_rules.busy_hypers(art, flags)
    if not hyper_rules.valid(art, values):           # a requirement pins a flag
        for name in flags:
            trial = hyper_rules.busy_hypers(art, {**flags, name: art.hypers[name].default})
            if hyper_rules.valid(art, trial):
                return trial
    return values


TRIED = {"float": [0.5, 0.9, 0.1, 0.03, 0.7, 1e-3, 2.0, -0.5, 10.0, -2.0],
         "int": [0, 1, 2, 3, 4, 10]}


def pinned(art, values: dict) -> list[str]:
    """Hyperparameters ``values`` leaves at their defaults although another valid value
    (of a few tried here) exists with the rest as they are: what the test forbids."""
    out = []
    for name, info in art.hypers.items():
        if values[name] != info.default:
            continue
        others = [not info.default] if info.is_flag else \
            [None] * info.optional + TRIED[info.type]
        if any(c != info.default and hyper_rules.valid(art, {**values, name: c})
               for c in others):
            out.append(name)
    return out


def betas(hypers) -> list[str]:
    """What a torch-style ``betas`` tuple sets (docs/torch-forms.md): the spec's declared
    ``betas`` tuple, or beta1, beta2, ... without a gap, where the spec has at least two
    and no ``betas`` of its own."""
    return tuple_names({n: getattr(h, "info", h) for n, h in hypers.items()}).get("betas", [])


def torch_kwargs(cls: type, art, values: dict, as_tuple: bool) -> dict:
    """``values`` (spec names) as the class's constructor takes them: a torch form by
    torch's argument names (tuples such as ``betas``; the spec-only ``rescale_grad`` and
    ``clip_gradient`` are not torch arguments), a seed form by the spec's names, or
    with ``betas`` as one tuple of every ``beta<k>`` (``as_tuple``)."""
    changed = {n: v for n, v in values.items() if v != art.hypers[n].default}
    if not issubclass(cls, TorchForm):
        names = betas(art.hypers) if as_tuple else []
        out = {n: v for n, v in changed.items() if n not in names}
        lr = inspect.signature(cls).parameters.get("lr")
        if lr is not None and lr.default is None and "lr" not in out:
            out["lr"] = values["lr"]        # (CAME: the authors' class needs an lr)
        if names:
            out["betas"] = tuple(values[n] for n in names)
        return out
    out = {}
    for key in inspect.signature(cls).parameters:
        if key in SPLIT and all(n in art.hypers for n in SPLIT[key]):
            if any(n in changed for n in SPLIT[key]):
                out[key] = tuple(values[n] for n in SPLIT[key])
        elif key == "adjust_lr_fn" and "match_rms_adamw" in changed:
            out[key] = "match_rms_adamw" if values["match_rms_adamw"] else None
        elif key in changed:
            out[key] = values[key]
    return out


def _params(cls: type, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(4, 3, generator=g))
    if getattr(cls, "probe_params", False):     # torch's own checks: 2-D (Muon, SparseAdam)
        return [weight]
    return [weight, torch.nn.Parameter(torch.randn(3, generator=g))]


def _step(opt, params: list, g: torch.Generator) -> None:
    """One step: gradients (row-sparse for SparseAdam), the spec's inputs, and its
    statistics on a step that refreshes."""
    art = opt._artifact
    for p in params:
        grad = torch.randn(p.shape, generator=g)
        if isinstance(opt, otorch.SparseAdam):
            rows = torch.tensor([0, 2])
            grad = torch.sparse_coo_tensor(rows[None], grad[rows], p.shape)
        p.grad = grad
    extra = {n: [torch.randn(p.shape, generator=g) for p in params] for n in art.inputs}
    if art.statistics and opt.refresh_due:
        for name, shape in art.statistics.items():
            mats = []
            for p in params:
                n = None if p.ndim != 2 else p.shape[0] if shape == "rr" else p.shape[1]
                x = None if n is None else torch.randn(n + 3, n, generator=g)
                mats.append(None if x is None else x.T @ x)
            extra[name] = mats
    opt.step(**extra)


def _same_states(a, b, pa: list, pb: list, exact: bool, count: bool = True) -> None:
    """Equal states (``exact``: bit for bit; else within float32 rounding; ``count``:
    the step counts too)."""
    for p, q in zip(pa, pb):
        sa, sb = a.state[p], b.state[q]
        assert set(sa) == set(sb)
        for n in sa if count else set(sa) - {"step"}:
            x, y = sa[n], sb[n]
            if isinstance(x, torch.Tensor):
                assert torch.equal(x, y) if exact else \
                    torch.allclose(x, y, rtol=1e-5, atol=1e-6), n
            else:
                assert x == y if exact else x == pytest.approx(y, rel=1e-6), n


def _cases():
    from optgen.compiler.loader import load_spec     # (reads the spec: builds nothing)
    for path in SPECS:
        if _rel(path) == "specs/adam_mini.py":   # named_parameters, heads set per name:
            continue                              # tests/test_adam_mini.py
        marks = family_sampled(os.path.basename(path)[:-3], "torch_make")
        yield pytest.param(path, "defaults", id=f"{_rel(path)}-defaults", marks=marks)
        yield pytest.param(path, "non-default", id=f"{_rel(path)}-non-default", marks=marks)
        if betas(load_spec(path).hypers) and \
                not issubclass(otorch.make(path), TorchForm):
            yield pytest.param(path, "betas", id=f"{_rel(path)}-betas", marks=marks)


@pytest.mark.parametrize("path,setting", list(_cases()))
def test_every_spec_constructs_steps_schedules_and_checkpoints(path, setting):
    cls = otorch.make(path)
    art = get_artifact(path)
    values = {n: h.default for n, h in art.hypers.items()}
    if setting != "defaults":
        values = non_default(art)
        assert hyper_rules.valid(art, values)
        assert not pinned(art, values), f"left at their defaults: {pinned(art, values)}"
    kwargs = torch_kwargs(cls, art, values, as_tuple=setting == "betas")
    params = _params(cls, 0)
    opt = cls(params, **kwargs)
    if hasattr(opt, "train"):    # Schedule-Free steps in train mode (its train()/eval())
        opt.train()
    group = opt.param_groups[0]
    scheduled = isinstance(group.get("lr"), float)
    assert scheduled or setting == "defaults", f"lr {group.get('lr')!r} cannot be scheduled"
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) if scheduled else None
    g = torch.Generator().manual_seed(1)
    before = [p.detach().clone() for p in params]
    for _ in range(STEPS):
        _step(opt, params, g)
        if sched is not None:
            sched.step()
    assert all(torch.isfinite(p).all() for p in params)
    assert any(not torch.equal(p, b) for p, b in zip(params, before)), "nothing moved"
    if sched is not None:
        assert group["lr"] == pytest.approx(values["lr"] * 0.5 ** STEPS)

    # a checkpoint through torch.save: each format the class writes, into a fresh
    # optimizer (and scheduler) on copies of the parameters; all then step alike
    twins = []
    for fmt in (("torch", "optgen") if issubclass(cls, TorchForm) else (None,)):
        buffer = io.BytesIO()
        sd = opt.state_dict() if fmt is None else opt.state_dict(format=fmt)
        torch.save({"opt": sd, "sched": sched and sched.state_dict()}, buffer)
        buffer.seek(0)
        saved = torch.load(buffer, weights_only=False)
        ps = [torch.nn.Parameter(p.detach().clone()) for p in params]
        other = cls(ps, **kwargs)
        other.load_state_dict(saved["opt"])
        other_sched = None
        if sched is not None:
            other_sched = torch.optim.lr_scheduler.StepLR(other, step_size=1, gamma=0.5)
            other_sched.load_state_dict(saved["sched"])
        # torch's format keeps scalar states (NAdam's mu_product, ASGD's eta and mu) in
        # torch's scalar dtype (float32), optgen's runtime in float64: that round trip
        # rounds them once; every other one is exact
        exact = fmt != "torch" or not any(isinstance(v, float) for p in params
                                           for v in opt.state[p].values())
        # (torch's SGD and Muon keep no step count: from torch's format it restarts at
        # 0, and their rules do not read it)
        count = fmt != "torch" or cls.step_kind is not None
        _same_states(opt, other, params, ps, exact, count)
        twins.append((other, ps, other_sched, exact, count))
    for seed in range(STEPS):
        for o, ps, s in ((opt, params, sched), *((t[0], t[1], t[2]) for t in twins)):
            _step(o, ps, torch.Generator().manual_seed(10 + seed))
            if s is not None:
                s.step()
    for other, ps, _, exact, count in twins:
        for p, q in zip(params, ps):
            assert torch.equal(p, q) if exact else torch.allclose(p, q, rtol=1e-5, atol=1e-6)
        _same_states(opt, other, params, ps, exact, count)


def test_adan_takes_betas_as_a_triple_or_by_name():
    """The docs' Adan (examples/specs/adan.py): three betas, as one torch-style tuple or
    by name; a pair is refused with the names it needs."""
    cls = otorch.make(os.path.join(ROOT, "examples", "specs", "adan.py"))
    p = [torch.nn.Parameter(torch.ones(3))]
    assert cls(p).param_groups[0]["betas"] == (0.98, 0.92, 0.99)
    assert cls(p, betas=(0.9, 0.8, 0.7)).param_groups[0]["betas"] == (0.9, 0.8, 0.7)
    assert cls(p, beta3=0.5).param_groups[0]["betas"] == (0.98, 0.92, 0.5)
    with pytest.raises(TypeError, match=r"betas must be a triple \(beta1, beta2, beta3\), "
                                        r"got \(0\.9, 0\.99\)"):
        cls(p, betas=(0.9, 0.99))
    with pytest.raises(ValueError, match=r"invalid beta3=1\.0"):
        cls(p, betas=(0.9, 0.8, 1.0))
    numpy_twin = np.ones(3, np.float32)
    import optgen
    ref = optgen.create(get_artifact(os.path.join(ROOT, "examples", "specs", "adan.py")),
                        [numpy_twin], betas=(0.9, 0.8, 0.7))
    opt = cls(p, betas=(0.9, 0.8, 0.7))
    for k in range(3):
        grad = np.full(3, 0.1 * (k + 1), np.float32)
        p[0].grad = torch.from_numpy(grad.copy())
        opt.step()
        ref.step([grad])
    np.testing.assert_array_equal(p[0].detach().numpy(), numpy_twin)
