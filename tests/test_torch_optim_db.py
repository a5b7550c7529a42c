"""optgen.torch's torch forms are torch.optim's optimizers, by torch's own tables.

``torch.testing._internal.common_optimizers.optim_db`` lists, per optimizer, the
constructor configs torch tests (``optim_inputs_func``) and the bad inputs with the
exception each raises (``optim_error_inputs_func``). This module reads them at run time
(a config torch adds is tested without an edit) and, for every optimizer optgen shares
with torch (optgen.torch.TORCH_FORMS):

* every config, float32 and float64 (then as torch's default dtype, which torch's
  scalar states such as ``step`` and NAdam's ``mu_product`` take): torch.optim and optgen step a small model 10 steps
  from the same start on the same batches; then each loads the other's ``state_dict``
  into a fresh optimizer of its own kind on a copy of the other's model (both directions
  of the checkpoint format), and all four step 10 more. The parameters and states after
  20 steps agree within 1e-5 (float32) / 1e-10 (float64) of the largest magnitude, the
  state_dicts have torch's keys, and ``param_groups`` equal torch's (keys and values);
* every bad input raises torch's exception type (or a subclass) with torch's message;
* every constructor signature is torch's (names, order, kinds, defaults).

Configs optgen does not support are listed in UNSUPPORTED with the reason (one place).
"""
import contextlib
import copy
import inspect
import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("expecttest", reason="torch's optimizer tables import expecttest")
from torch.testing._internal.common_optimizers import (OptimizerErrorEnum,  # noqa: E402
                                                       optim_db)

import optgen.torch as ot  # noqa: E402

# (class or "*", desc of a config or bad input) -> what optgen does otherwise, and why;
# the only exceptions to torch's tables
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("*", "a param group cannot have duplicate parameters"):
        "torch warns (this test checks its warning) and steps the parameter twice per "
        "step; optgen warns the same and then refuses the group (ValueError)",
}
SHARED = [info for info in optim_db if info.optim_cls.__name__ in ot.TORCH_FORMS]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
STEPS = 10   # before the checkpoint swap, and after it


def _inputs(info):
    try:
        return info.optim_inputs_func(device="cpu")
    except TypeError:   # (some take a dtype)
        return info.optim_inputs_func(device="cpu", dtype=torch.float32)


CONFIGS = [pytest.param(info, k, dtype, id=f"{info.optim_cls.__name__}-{oi.desc}-"
                        f"{str(dtype)[6:]}")
           for info in SHARED for k, oi in enumerate(_inputs(info)) for dtype in TOL]
ERRORS = [pytest.param(info, e, id=f"{info.optim_cls.__name__}-{i}-"
                       f"{e.optimizer_error_input.desc}")
          for info in SHARED
          for i, e in enumerate(info.optim_error_inputs_func(device="cpu", dtype=torch.float32))]


def _model(name, dtype):
    torch.manual_seed(0)
    if name == "SparseAdam":   # sparse gradients: an embedding table
        return torch.nn.Embedding(10, 3, sparse=True).to(dtype)
    bias = name != "Muon"   # (Muon takes 2-D parameters only)
    return torch.nn.Sequential(torch.nn.Linear(4, 3, bias=bias), torch.nn.Tanh(),
                               torch.nn.Linear(3, 2, bias=bias)).to(dtype)


def _batches(name, dtype, n):
    g = torch.Generator().manual_seed(1)
    if name == "SparseAdam":
        return [(torch.randint(0, 10, (5,), generator=g), torch.randn(5, 3, generator=g,
                                                                      dtype=dtype))
                for _ in range(n)]
    return [(torch.randn(8, 4, generator=g, dtype=dtype),
             torch.randn(8, 2, generator=g, dtype=dtype)) for _ in range(n)]


def _steps(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _kwargs(oi):
    """The config's arguments, tensors copied (each optimizer keeps its own lr tensor)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in oi.kwargs.items()}


def _close(mine, ref, tol, what):
    if not isinstance(ref, torch.Tensor):   # (SparseAdam's int step, SGD's None buffer)
        assert type(mine) is type(ref) and mine == ref, f"{what}: {mine!r} vs torch's {ref!r}"
        return
    assert isinstance(mine, torch.Tensor) and mine.shape == ref.shape and \
        mine.dtype == ref.dtype, f"{what}: {getattr(mine, 'shape', mine)} " \
        f"{getattr(mine, 'dtype', '')} vs torch's {ref.shape} {ref.dtype}"
    scale = max(float(ref.abs().max()), 1e-30) if ref.numel() else 1.0
    err = float((mine.double() - ref.double()).abs().max()) if ref.numel() else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} * {scale:.3g}"


def _same_run(mine, ref, tol, what):
    (m_model, m_opt), (r_model, r_opt) = mine, ref
    for i, (p, q) in enumerate(zip(m_model.parameters(), r_model.parameters())):
        _close(p.detach(), q.detach(), tol, f"{what}: parameter {i}")
    m_sd, r_sd = m_opt.state_dict(), r_opt.state_dict()
    assert set(m_sd["state"]) >= set(r_sd["state"]), what
    for pid, rec in r_sd["state"].items():
        assert set(m_sd["state"][pid]) == set(rec), \
            f"{what}: state {pid} keys {sorted(m_sd['state'][pid])} vs torch's {sorted(rec)}"
        for k, v in rec.items():
            _close(m_sd["state"][pid][k], v, tol, f"{what}: state {pid}.{k}")


@pytest.mark.parametrize("info, k, dtype", CONFIGS)
def test_config_steps_and_checkpoints_as_torch(info, k, dtype):
    name = info.optim_cls.__name__
    # torch keeps step, NAdam's mu_product and ASGD's eta/mu in the default dtype
    # (_get_scalar_dtype), and the table's tensor lr is made in it: float64 runs make it
    # float64, as the parameters
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        oi = _inputs(info)[k]
        if (name, oi.desc) in UNSUPPORTED:
            pytest.skip(UNSUPPORTED[(name, oi.desc)])
        assert oi.params is None, f"{name} '{oi.desc}': torch's table gives params; this " \
                                  "test builds its own model (extend _model)"
        _compare(info, oi, dtype)
    finally:
        torch.set_default_dtype(previous)


def _compare(info, oi, dtype):
    name = info.optim_cls.__name__
    mine_cls, tol = ot.TORCH_FORMS[name], TOL[dtype]
    first, then = _batches(name, dtype, STEPS), _batches(name, dtype, 2 * STEPS)[STEPS:]
    runs = {}
    for who, cls in (("optgen", mine_cls), ("torch", info.optim_cls)):
        model = _model(name, dtype)
        opt = cls(model.parameters(), **_kwargs(oi))
        _steps(model, opt, first)
        runs[who] = (model, opt)
    assert runs["optgen"][1].param_groups[0].keys() == runs["torch"][1].param_groups[0].keys()
    _same_run(runs["optgen"], runs["torch"], tol, f"{name} '{oi.desc}' after {STEPS} steps")
    # each resumes from the other's checkpoint: optgen from torch's, torch from optgen's
    for who, cls, other in (("optgen<-torch", mine_cls, "torch"),
                            ("torch<-optgen", info.optim_cls, "optgen")):
        model = copy.deepcopy(runs[other][0])
        opt = cls(model.parameters(), **_kwargs(oi))
        opt.load_state_dict(copy.deepcopy(runs[other][1].state_dict()))
        runs[who] = (model, opt)
    for model, opt in runs.values():
        _steps(model, opt, then)
    for who in ("optgen", "optgen<-torch", "torch<-optgen"):
        mine, ref = (runs[who], runs["torch"]) if who != "torch<-optgen" else \
            (runs["optgen"], runs[who])
        _same_run(mine, ref, tol, f"{name} '{oi.desc}' {who}, {2 * STEPS} steps")


@pytest.mark.parametrize("info, e", ERRORS)
def test_bad_input_raises_torchs_error(info, e):
    oi = e.optimizer_error_input
    cls = ot.TORCH_FORMS[info.optim_cls.__name__]
    if issubclass(e.error_type, Warning):
        refused = ("*", oi.desc) in UNSUPPORTED
        with pytest.warns(e.error_type, match=e.error_regex), \
                pytest.raises(ValueError) if refused else contextlib.nullcontext():
            cls(oi.params, **oi.kwargs)
        return
    with pytest.raises(e.error_type, match=e.error_regex):
        opt = cls(oi.params, **oi.kwargs)
        # torch raises a STEP_ERROR at its step; optgen may refuse earlier, at construction
        assert e.error_on == OptimizerErrorEnum.STEP_ERROR, "constructed without the error"
        opt.step()


@pytest.mark.parametrize("name", sorted(ot.TORCH_FORMS))
def test_signature_is_torchs(name):
    def described(c):
        return [(p.name, p.kind, p.default) for p in inspect.signature(c).parameters.values()]
    theirs = getattr(torch.optim, name)
    assert described(ot.TORCH_FORMS[name]) == described(theirs)
    assert described(ot.TORCH_FORMS[name].__init__) == described(theirs.__init__)


def test_every_shared_optimizer_is_in_torchs_tables():
    """The tables cover every torch form (else its configs would go untested)."""
    assert sorted(i.optim_cls.__name__ for i in SHARED) == sorted(ot.TORCH_FORMS)
    assert all(re.fullmatch(r"[A-Z]\w+", n) for n in ot.TORCH_FORMS)
