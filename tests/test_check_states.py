"""``optgen check`` compares every state, not only the parameters, and its busy setting
moves every kind of hyperparameter (floats, integers, optional ones between None and a
value; flags run at both values).

The failures are made on purpose: the reference interpreter (or the compiled step)
gets a wrong state while the parameters stay right, and check must say FAILED and
name that state.
"""
import numpy as np
import pytest

import optgen
from optgen import cli, commands
from optgen.core import hyper as hyper_rules
from optgen.core import reference
from optgen.runtime.optimizer import Optimizer

# a state the parameter update never reads: a wrong one cannot show in the parameters
TRACKER = """\
from optgen.dsl import Spec
spec = Spec('tracker')
lr = spec.hyper('lr', 0.1, 'lr >= 0')
avg = spec.state('avg')
@spec.update
def tracker(w, grad, flags):
    w_t = w - lr * grad
    return {avg: 0.5 * avg + 0.5 * w_t, w: w_t}
"""

# one hyperparameter of every kind, each read by the update
KINDS = """\
from optgen.dsl import Spec, minimum, maximum, where
spec = Spec('kinds')
lr = spec.hyper('lr', 0.1, 'lr >= 0')
every = spec.hyper('every', 7, 'every >= 1', type='int')
start = spec.hyper('start', None, 'start >= 1', type='int', optional=True, none_value=0)
cap = spec.hyper('cap', None, 'cap > 0', optional=True, none_value=float('inf'))
floor = spec.hyper('floor', 1.0, 'floor > 0', optional=True, none_value=0.0)
spec.flag('halve', False)
m = spec.state('m')
@spec.update
def kinds(w, grad, flags):
    g = maximum(minimum(grad, cap), -cap)
    m_t = where(spec.t > start, m + g / every, g)
    step = lr * m_t * (0.5 if flags.halve else 1.0)
    return {m: m_t, w: w - step + 0.001 * floor}
"""


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("check-specs")
    out = {}
    for name, text in (("tracker", TRACKER), ("kinds", KINDS)):
        path = folder / f"{name}.py"
        path.write_text(text)
        out[name] = (str(path), optgen.get_artifact(str(path)))
    return out


def _wrong_state(monkeypatch, state: str, by: float) -> None:
    """The reference interpreter stores ``state`` off by ``by`` (the other outputs as
    they were)."""
    evaluate = reference.evaluate

    def wrong(*args, **kwargs):
        new = evaluate(*args, **kwargs)
        if state in new:
            new[state] = new[state] + new[state].dtype.type(by)
        return new
    monkeypatch.setattr(reference, "evaluate", wrong)


def test_a_state_only_the_reference_gets_wrong_fails_and_is_named(arts, monkeypatch):
    path, art = arts["tracker"]
    assert all(r.ok for r in commands.check(art))       # (as built: kernel == reference)
    _wrong_state(monkeypatch, "avg", 1e-3)
    results = commands.check(art)
    ran = [r for r in results if r.skipped is None]
    assert ran and not any(r.ok for r in ran)
    for r in ran:
        assert r.worst == "avg" and r.failed == ["avg"], r
        assert r.errors[commands.PARAM] <= commands.TOLERANCE[r.dtype]   # (params: right)
        # avg's error e = 0.5 e + 1e-3 a step: 1e-3 * (1 + 0.5 + ... + 0.5**4) after 5
        assert r.max_abs == pytest.approx(1.9375e-3, rel=1e-3)


def test_the_cli_fails_and_names_the_state(arts, monkeypatch, capsys):
    path, _ = arts["tracker"]
    assert cli.main(["check", path]) == 0
    ok = capsys.readouterr().out.strip().splitlines()
    assert ok and all(ln.endswith(": ok") for ln in ok), ok
    _wrong_state(monkeypatch, "avg", 1e-3)
    assert cli.main(["check", path]) == 1
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines and all("in state avg (absolute 1.94e-03)" in ln and
                         ln.endswith("FAILED (tolerance 1e-05 exceeded in state avg)")
                         or "FAILED (tolerance 1e-12 exceeded in state avg)" in ln
                         for ln in lines), out
    assert err.startswith("optgen: check failed:")


def test_a_kernel_state_wrong_while_the_parameters_stay_in_tolerance(monkeypatch):
    """Adam's compiled v off by 0.1 % after every step: the parameters move only by
    about lr * 5e-4 (inside the tolerance), so a check of the parameters alone passes;
    the state comparison fails and names v."""
    art = optgen.get_artifact("adam")
    step = Optimizer.step

    def broken(self, grads, **inputs):
        done = step(self, grads, **inputs)
        if self.backend == "compiled":
            for st in self.state:
                st["v"] *= st["v"].dtype.type(1.001)
        return done
    monkeypatch.setattr(Optimizer, "step", broken)
    ran = [r for r in commands.check(art) if r.skipped is None]
    assert ran and not any(r.ok for r in ran)
    for r in ran:
        assert r.worst == "v" and "v" in r.failed, r
    for r in ran:                       # float32: a wrong v, parameters in tolerance
        if r.dtype == "float32" and r.setting == "default":
            assert r.failed == ["v"], r
            assert r.errors[commands.PARAM] <= commands.TOLERANCE[r.dtype]


def test_busy_moves_every_kind_of_hyperparameter(arts):
    _, art = arts["kinds"]
    defaults = {n: h.default for n, h in art.hypers.items()}
    for halve in (False, True):
        busy = hyper_rules.busy_hypers(art, {"halve": halve})
        assert hyper_rules.valid(art, busy)
        assert busy["halve"] is halve
        moved = {n for n in defaults if busy[n] != defaults[n]} - {"halve"}
        assert moved == {"lr", "every", "start", "cap", "floor"}, busy
        assert isinstance(busy["every"], int) and isinstance(busy["start"], int)
        assert busy["cap"] is not None and busy["floor"] is None
    results = commands.check(art)
    busy = [r for r in results if r.setting == "busy"]
    assert {(r.dtype, r.flags["halve"]) for r in busy if r.skipped is None} == \
        {(d, v) for d in art.dtypes for v in (False, True)}
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    for r in busy:
        assert r.hyper["every"] != 7 and r.hyper["start"] is not None
        assert r.hyper["floor"] is None and r.hyper["cap"] is not None


@pytest.mark.parametrize("name,moved", [
    ("muon", {"ns_steps"}),                                       # an int
    ("shampoo", {"precondition_frequency", "start_preconditioning_step"}),   # int, optional int
])
def test_busy_moves_the_integer_hyperparameters_of_catalog_specs(name, moved):
    art = optgen.get_artifact(name)
    busy = hyper_rules.busy_hypers(art, {})
    assert hyper_rules.valid(art, busy)
    for n in moved:
        assert busy[n] != art.hypers[n].default and isinstance(busy[n], int), (n, busy)
