"""Learning-rate schedules against hand computations, MXNet's stateful schedulers (re-told
here) and torch.optim.lr_scheduler; composition; every validation error.

Each expected value below is computed in this file from the rule in docs/schedules.md,
never with the module's helpers. ``step`` is the number of updates already applied."""
import math

import numpy as np
import pytest

from optgen.runtime import schedules
from optgen.runtime.schedules import Schedule, as_schedule

N = 50  # the "50 steps"


def values(schedule, n=N):
    return [schedule(step) for step in range(n)]


def close(got, want):
    assert len(got) == len(want)
    for step, (g, w) in enumerate(zip(got, want)):
        assert type(g) is float, f"step {step}: {type(g).__name__}"
        assert g == pytest.approx(w, rel=1e-12, abs=1e-15), f"step {step}: {g} != {w}"


# -- MXNet's stateful schedulers, told here as in mxnet/lr_scheduler.py (num_update = step+1)
class MXFactor:
    def __init__(self, step, factor, stop_factor_lr, base_lr):
        self.step, self.factor, self.stop, self.base_lr, self.count = (step, factor,
                                                                       stop_factor_lr, base_lr, 0)

    def __call__(self, num_update):
        while num_update > self.count + self.step:
            self.count += self.step
            self.base_lr *= self.factor
            if self.base_lr < self.stop:
                self.base_lr = self.stop
        return self.base_lr


class MXMultiFactor:
    def __init__(self, step, factor, base_lr):
        self.step, self.factor, self.base_lr, self.cur = list(step), factor, base_lr, 0

    def __call__(self, num_update):
        while self.cur <= len(self.step) - 1:
            if num_update > self.step[self.cur]:
                self.cur += 1
                self.base_lr *= self.factor
            else:
                return self.base_lr
        return self.base_lr


def mx_cosine(num_update, max_update, base_lr, final_lr, warmup_steps, warmup_begin_lr):
    if num_update < warmup_steps:
        return warmup_begin_lr + (base_lr - warmup_begin_lr) * num_update / warmup_steps
    num_update = min(num_update, max_update)
    return final_lr + (base_lr - final_lr) * (
        1 + math.cos(math.pi * (num_update - warmup_steps) / (max_update - warmup_steps))) / 2


# -- torch.optim.lr_scheduler as an oracle --------------------------------------------------
def torch_lrs(make_scheduler, lr, n=N):
    """The lr torch uses for each of the first n optimizer steps."""
    torch = pytest.importorskip("torch", reason="torch is the oracle for torch's schedulers")
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    scheduler = make_scheduler(torch.optim.lr_scheduler, opt)
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n - 1):
        opt.step()
        scheduler.step()
        out.append(opt.param_groups[0]["lr"])
    return out


# -- each schedule by hand, 50 steps ----------------------------------------------------------
def test_constant():
    close(values(schedules.constant(0.05)), [0.05] * N)
    close(values(schedules.constant(0)), [0.0] * N)


def test_factor_by_hand_and_mxnet():
    s = schedules.factor(0.8, step_size=7, factor=0.5, stop_factor_lr=1e-3)
    want, lr = [], 0.8
    for step in range(N):
        if step > 0 and step % 7 == 0:
            lr *= 0.5
        want.append(max(lr, 1e-3))
    close(values(s), want)
    mx = MXFactor(7, 0.5, 1e-3, 0.8)
    close(values(s), [mx(step + 1) for step in range(N)])
    assert s(10_000) == 1e-3
    assert schedules.step_decay is schedules.factor


def test_factor_floor_never_exceeds_base_lr():
    s = schedules.factor(1e-9, 5, 0.1)  # default stop_factor_lr 1e-8 > base_lr
    close(values(s, 20), [1e-9] * 20)


def test_factor_vs_torch_steplr():
    s = schedules.factor(0.3, step_size=6, factor=0.7, stop_factor_lr=0.0)
    close(values(s), torch_lrs(lambda sch, o: sch.StepLR(o, step_size=6, gamma=0.7), 0.3))


def test_multi_factor_by_hand_and_mxnet():
    s = schedules.multi_factor(0.2, [5, 12, 30], 0.1)
    want = []
    for step in range(N):
        lr = 0.2
        for m in (5, 12, 30):
            if step >= m:
                lr = lr * 0.1
        want.append(lr)
    close(values(s), want)
    mx = MXMultiFactor([5, 12, 30], 0.1, 0.2)
    close(values(s), [mx(step + 1) for step in range(N)])


def test_multi_factor_vs_torch_multisteplr():
    s = schedules.multi_factor(0.2, (3, 17, 40), 0.5)
    close(values(s), torch_lrs(lambda sch, o: sch.MultiStepLR(o, [3, 17, 40], gamma=0.5), 0.2))


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_polynomial_by_hand(power):
    s = schedules.polynomial(0.1, 40, final_lr=0.01, power=power)
    want = [0.01 + (0.1 - 0.01) * (1 - min(step, 40) / 40) ** power for step in range(N + 20)]
    close(values(s, N + 20), want)
    assert s(40) == s(41) == s(10 ** 9) == 0.01


def test_polynomial_with_warmup_by_hand():
    s = schedules.polynomial(0.1, 45, final_lr=0.0, power=2, warmup_steps=10, warmup_begin_lr=0.02)
    want = []
    for step in range(N + 10):
        if step < 10:
            want.append(0.02 + (0.1 - 0.02) * step / 10)
        elif step < 45:
            want.append(0.1 * (1 - (step - 10) / 35) ** 2)
        else:
            want.append(0.0)
    close(values(s, N + 10), want)
    assert s(10) == 0.1


def test_polynomial_vs_torch_polynomiallr():
    s = schedules.polynomial(0.4, 30, power=1.5)
    close(values(s), torch_lrs(lambda sch, o: sch.PolynomialLR(o, total_iters=30, power=1.5), 0.4))


def test_cosine_by_hand():
    s = schedules.cosine(0.1, 40, final_lr=0.001)
    want = [0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * min(step, 40) / 40)) / 2
            for step in range(N + 20)]
    close(values(s, N + 20), want)
    assert s(0) == pytest.approx(0.1) and s(40) == s(10 ** 9) == 0.001


def test_cosine_with_warmup_by_hand():
    s = schedules.cosine(1e-3, 45, final_lr=1e-5, warmup_steps=8, warmup_begin_lr=1e-4)
    want = []
    for step in range(N + 10):
        if step < 8:
            want.append(1e-4 + (1e-3 - 1e-4) * step / 8)
        elif step <= 45:
            want.append(1e-5 + (1e-3 - 1e-5) * (1 + math.cos(math.pi * (step - 8) / 37)) / 2)
        else:
            want.append(1e-5)
    close(values(s, N + 10), want)


def test_cosine_is_mxnet_formula_at_num_update_equal_step():
    s = schedules.cosine(0.5, 40, final_lr=0.05, warmup_steps=6, warmup_begin_lr=0.01)
    close(values(s), [mx_cosine(step, 40, 0.5, 0.05, 6, 0.01) for step in range(N)])


def test_cosine_vs_torch_cosineannealinglr():
    s = schedules.cosine(0.3, N - 1, final_lr=0.01)  # steps 0..T_max
    close(values(s), torch_lrs(lambda sch, o: sch.CosineAnnealingLR(o, T_max=N - 1, eta_min=0.01),
                               0.3))


def test_linear_warmup_by_hand():
    s = schedules.linear_warmup(10, 0.2, begin_lr=0.02)
    close(values(s), [0.02 + (0.2 - 0.02) * step / 10 if step < 10 else 0.2 for step in range(N)])
    t = schedules.linear_warmup(5, schedules.factor(0.4, 10, 0.5, 0.0))
    want = [0.4 * step / 5 if step < 5 else 0.4 * 0.5 ** ((step - 5) // 10) for step in range(N)]
    close(values(t), want)
    close(values(schedules.linear_warmup(0, 0.3)), [0.3] * N)


def test_linear_warmup_vs_torch_linearlr():
    s = schedules.linear_warmup(12, 0.5, begin_lr=0.5 * 0.1)
    close(values(s), torch_lrs(lambda sch, o: sch.LinearLR(o, start_factor=0.1, end_factor=1.0,
                                                           total_iters=12), 0.5))


def hand_one_cycle(step, max_lr, total, pct, div, final_div):
    """The default OneCycleLR (two phases, cosine), written out."""
    initial, minimum = max_lr / div, max_lr / div / final_div
    step = min(step, total - 1)
    up_end = pct * total - 1
    if step <= up_end:
        start, end, frac = initial, max_lr, step / up_end
    else:
        start, end, frac = max_lr, minimum, (step - up_end) / (total - 1 - up_end)
    return end + (start - end) * (1 + math.cos(math.pi * frac)) / 2


def test_one_cycle_by_hand():
    s = schedules.one_cycle(0.1, N, pct_start=0.25, div_factor=20.0, final_div_factor=100.0)
    close(values(s, N + 10), [hand_one_cycle(step, 0.1, N, 0.25, 20.0, 100.0)
                              for step in range(N + 10)])
    assert s(N - 1) == pytest.approx(0.1 / 20 / 100) and s(N + 100) == s(N - 1)


@pytest.mark.parametrize("kw", [
    {},
    {"pct_start": 0.25, "div_factor": 10.0, "final_div_factor": 100.0},
    {"anneal": "linear"},
    {"three_phase": True},
    {"three_phase": True, "anneal": "linear", "pct_start": 0.4},
    {"pct_start": 0.0},
    {"pct_start": 1.0},
    {"pct_start": 0.01},
])
def test_one_cycle_vs_torch_onecyclelr(kw):
    torch_kw = dict(kw)
    if "anneal" in torch_kw:
        torch_kw["anneal_strategy"] = torch_kw.pop("anneal")
    s = schedules.one_cycle(0.2, N, **kw)
    want = torch_lrs(lambda sch, o: sch.OneCycleLR(o, max_lr=0.2, total_steps=N,
                                                   cycle_momentum=False, **torch_kw), 0.2)
    close(values(s), want)
    assert s(N) == s(N + 7) == s(N - 1)  # held after the end (torch raises past total_steps)


# -- the per-step sequence ----------------------------------------------------------------
def test_sequence_takes_the_ith_value():
    vals = [0.1 / (1 + i) for i in range(N)]
    for given in (vals, tuple(vals), np.asarray(vals, np.float32), (v for v in vals)):
        s = as_schedule(given, owner="adam")
        want = [float(np.float32(v)) for v in vals] if isinstance(given, np.ndarray) else vals
        close(values(s), want)
        with pytest.raises(ValueError, match=r"^adam: lr sequence has 50 values and step 50 "
                                             r"was requested \(steps 0\.\.49 are defined\)$"):
            s(N)
        with pytest.raises(ValueError, match="step 1000 was requested"):
            s(1000)
    close(values(schedules.sequence(range(N))), [float(i) for i in range(N)])


def test_sequence_is_materialized_once():
    arr = np.linspace(0.1, 0.0, N)
    lst = list(arr)
    s, t = as_schedule(arr), schedules.sequence(lst)
    arr[:] = 7.0
    lst[0] = 7.0
    assert s(0) == t(0) == 0.1


# -- composition ------------------------------------------------------------------------
def test_join_optax_semantics():
    s = schedules.join([0.1, schedules.cosine(0.1, 20), [0.05, 0.04, 0.03], lambda k: 0.001 * k],
                       [10, 30, 33])
    want = []
    for step in range(N):
        if step < 10:
            want.append(0.1)
        elif step < 30:
            want.append(0.1 * (1 + math.cos(math.pi * (step - 10) / 20)) / 2)
        elif step < 33:
            want.append([0.05, 0.04, 0.03][step - 30])
        else:
            want.append(0.001 * (step - 33))
    close(values(s), want)
    close(values(schedules.join([0.3], [])), [0.3] * N)


def test_warmup_then_cosine_is_cosine_with_warmup():
    composed = schedules.linear_warmup(10, schedules.cosine(0.1, 40, final_lr=0.002),
                                       begin_lr=0.01)
    built_in = schedules.cosine(0.1, 50, final_lr=0.002, warmup_steps=10, warmup_begin_lr=0.01)
    close(values(composed, N + 10), values(built_in, N + 10))


def test_product():
    c = schedules.cosine(0.1, 40)
    f = schedules.factor(1.0, 10, 0.5, 0.0)
    want = [0.5 * 0.1 * (1 + math.cos(math.pi * min(k, 40) / 40)) / 2 * 0.5 ** (k // 10)
            for k in range(N)]
    for s in (0.5 * c * f, c * 0.5 * f, np.float64(0.5) * (c * f), (c * f) * 0.5):
        assert isinstance(s, Schedule)
        close(values(s), want)


def test_pure_functions_of_step():
    s = schedules.join([schedules.factor(0.1, 3, 0.5), schedules.one_cycle(0.1, 20)], [15])
    forward = values(s)
    assert [s(k) for k in reversed(range(N))] == forward[::-1]
    assert [s(np.int64(k)) for k in range(N)] == forward
    assert values(s) == forward


def test_repr_reads_like_the_call():
    s = schedules.linear_warmup(100, schedules.cosine(1e-3, 900, final_lr=1e-5))
    assert repr(s) == ("linear_warmup(100, cosine(base_lr=0.001, max_steps=900, "
                       "final_lr=1e-05), begin_lr=0.0)")
    assert repr(0.5 * schedules.constant(0.1)) == "(0.5 * constant(0.1))"
    assert repr(schedules.cosine(1.0, 10, warmup_steps=2)) == (
        "cosine(base_lr=1.0, max_steps=10, final_lr=0.0, warmup_steps=2, warmup_begin_lr=0.0)")
    assert repr(as_schedule([0.1, 0.2])) == "sequence([0.1, 0.2])"
    assert repr(as_schedule(np.zeros(50))).startswith("sequence(50 values: [0.0, 0.0, 0.0, ...")
    assert repr(schedules.join([0.1, 0.2], [5])) == (
        "join([constant(0.1), constant(0.2)], boundaries=[5])")
    assert "multi_factor(base_lr=0.1, milestones=[3, 5], factor=0.5)" == repr(
        schedules.multi_factor(0.1, [3, 5], 0.5))


# -- as_schedule ----------------------------------------------------------------------------
def test_as_schedule_kinds():
    c = schedules.cosine(0.1, 10)
    assert as_schedule(c) is c
    assert values(as_schedule(0.01), 3) == [0.01] * 3
    assert values(as_schedule(np.float32(0.5)), 2) == [0.5, 0.5]
    assert values(as_schedule(3), 2) == [3.0, 3.0]
    f = as_schedule(lambda step: np.float32(0.1) * (step + 1))
    assert f(2) == pytest.approx(0.3) and type(f(2)) is float
    assert as_schedule(lambda step: np.array(0.25))(0) == 0.25
    assert as_schedule(lambda step: 2)(5) == 2.0


ERRORS = [
    # as_schedule: types and values
    (lambda: as_schedule(True, "adam"), TypeError,
     r"^adam: lr must be a real number, a sequence, a schedule or a callable step -> lr, "
     r"got bool True$"),
    (lambda: as_schedule("0.1", "adam"), TypeError, r"^adam: lr must be .*, got str '0\.1'$"),
    (lambda: as_schedule(None, "adam"), TypeError, r"^adam: lr must be .*, got NoneType None$"),
    (lambda: as_schedule(-0.1, "adam"), ValueError,
     r"^adam: lr must be a finite real number >= 0, got -0\.1$"),
    (lambda: as_schedule(math.nan, "adam"), ValueError, r"^adam: lr must be .*, got nan$"),
    (lambda: as_schedule(np.float64(math.inf), "adam"), ValueError, r"got inf$"),
    # sequences
    (lambda: as_schedule(np.zeros((2, 3)), "adam"), ValueError,
     r"^adam: lr sequence must be 1-D, got shape \(2, 3\)$"),
    (lambda: as_schedule(np.array(0.1), "adam"), ValueError,
     r"^adam: lr sequence must be 1-D, got shape \(\)$"),
    (lambda: as_schedule([], "adam"), ValueError,
     r"^adam: lr sequence is empty: it needs one value per step$"),
    (lambda: as_schedule([0.1, math.nan], "adam"), ValueError,
     r"^adam: lr sequence value 1 is nan: must be a finite real number$"),
    (lambda: as_schedule((0.1, 0.2, -0.3), "adam"), ValueError,
     r"^adam: lr sequence value 2 is -0\.3: must be >= 0$"),
    (lambda: as_schedule([0.1, True], "adam"), TypeError,
     r"^adam: lr sequence must hold real numbers, got bool True$"),
    (lambda: as_schedule(["0.1"], "adam"), TypeError,
     r"^adam: lr sequence must hold real numbers, got dtype <U3$"),
    (lambda: as_schedule([0.1, None], "adam"), TypeError,
     r"^adam: lr sequence must hold real numbers, got dtype object$"),
    (lambda: as_schedule(np.array([1 + 2j]), "adam"), TypeError, r"got dtype complex128$"),
    (lambda: as_schedule([[0.1, 0.2], [0.3]], "adam"), TypeError,
     r"^adam: lr sequence must be a 1-D sequence of real numbers; numpy could not read it"),
    (lambda: as_schedule({0.1, 0.2}, "adam"), TypeError,
     r"^adam: lr sequence must be an ordered 1-D sequence of real numbers, got set$"),
    (lambda: as_schedule({0: 0.1}, "adam"), TypeError, r"got dict$"),
    (lambda: schedules.sequence(np.ones((1, 4))), ValueError,
     r"^sequence: lr sequence must be 1-D, got shape \(1, 4\)$"),
    (lambda: schedules.sequence([0.1, 0.2])(2), ValueError,
     r"^sequence: lr sequence has 2 values and step 2 was requested"),
    # callables: results checked at each step
    (lambda: as_schedule(lambda k: math.nan if k == 3 else 0.1, "adam")(3), ValueError,
     r"^adam: lr schedule returned nan at step 3: must be a finite real number$"),
    (lambda: as_schedule(lambda k: -0.5, "adam")(4), ValueError,
     r"^adam: lr schedule returned -0\.5 at step 4: must be >= 0$"),
    (lambda: as_schedule(lambda k: "0.1", "adam")(0), TypeError,
     r"^adam: lr schedule returned str '0\.1' at step 0: must be a finite real number$"),
    (lambda: as_schedule(lambda k: True, "adam")(0), TypeError, r"returned bool True at step 0"),
    (lambda: as_schedule(lambda k: np.array([0.1]), "adam")(0), TypeError,
     r"returned ndarray array\(\[0\.1\]\) at step 0"),
    (lambda: schedules.constant(1e300) * 1e300 * (lambda s: 1), TypeError,
     r"^product: a schedule multiplies a real number >= 0 or another schedule, got function"),
    (lambda: (schedules.constant(1e300) * 1e300)(0), ValueError,
     r"^product: lr schedule returned inf at step 0"),
    # the step
    (lambda: schedules.constant(0.1)(-1), ValueError,
     r"^constant: step must be an int >= 0, got -1$"),
    (lambda: schedules.cosine(0.1, 9)(1.0), TypeError,
     r"^cosine: step must be an int >= 0, got float 1\.0$"),
    (lambda: schedules.cosine(0.1, 9)(True), TypeError, r"got bool True$"),
    (lambda: as_schedule([0.1], "adam")(-2), ValueError, r"^adam: step must be an int >= 0"),
    # products
    (lambda: schedules.constant(0.1) * -2.0, ValueError,
     r"^product: factor must be a finite real number >= 0, got -2\.0$"),
    (lambda: math.inf * schedules.constant(0.1), ValueError, r"got inf$"),
    (lambda: schedules.constant(0.1) * "2", TypeError, r"got str '2'$"),
    (lambda: [0.1] * schedules.constant(0.1), TypeError, r"got list \[0\.1\]$"),
    # constructors
    (lambda: schedules.constant(-1), ValueError,
     r"^constant: lr must be a finite real number >= 0, got -1$"),
    (lambda: schedules.constant("1"), TypeError, r"^constant: lr must be .*, got str '1'$"),
    (lambda: schedules.factor(0.1, 0, 0.5), ValueError,
     r"^factor: step_size must be an int > 0, got 0$"),
    (lambda: schedules.factor(0.1, 2.0, 0.5), TypeError,
     r"^factor: step_size must be an int > 0, got float 2\.0$"),
    (lambda: schedules.factor(0.1, 2, 1.5), ValueError,
     r"^factor: factor must be a finite real number with 0 <= factor <= 1, got 1\.5$"),
    (lambda: schedules.factor(0.1, 2, 0.5, stop_factor_lr=-1e-8), ValueError,
     r"^factor: stop_factor_lr must be a finite real number >= 0"),
    (lambda: schedules.factor(-0.1, 2, 0.5), ValueError, r"^factor: base_lr must be"),
    (lambda: schedules.multi_factor(0.1, [], 0.5), ValueError,
     r"^multi_factor: milestones must not be empty$"),
    (lambda: schedules.multi_factor(0.1, [5, 5], 0.5), ValueError,
     r"^multi_factor: milestones must be a strictly increasing sequence of ints > 0, "
     r"got \[5, 5\]$"),
    (lambda: schedules.multi_factor(0.1, [0, 5], 0.5), ValueError, r"got \[0, 5\]$"),
    (lambda: schedules.multi_factor(0.1, [1, 2.5], 0.5), TypeError,
     r"^multi_factor: milestones must be .*, got float 2\.5 in \[1, 2\.5\]$"),
    (lambda: schedules.multi_factor(0.1, 5, 0.5), TypeError, r"milestones must be .*, got int 5$"),
    (lambda: schedules.multi_factor(0.1, [5], -0.5), ValueError, r"^multi_factor: factor must be"),
    (lambda: schedules.polynomial(0.1, 0), ValueError,
     r"^polynomial: max_steps must be an int > 0, got 0$"),
    (lambda: schedules.polynomial(0.1, 10, power=0), ValueError,
     r"^polynomial: power must be a finite real number > 0, got 0$"),
    (lambda: schedules.polynomial(0.1, 10, warmup_steps=10), ValueError,
     r"^polynomial: warmup_steps must be < max_steps, got warmup_steps=10, max_steps=10$"),
    (lambda: schedules.cosine(0.1, 0), ValueError,
     r"^cosine: max_steps must be an int > 0, got 0$"),
    (lambda: schedules.cosine(0.1, 10, final_lr=math.nan), ValueError,
     r"^cosine: final_lr must be a finite real number >= 0, got nan$"),
    (lambda: schedules.cosine(0.1, 10, warmup_steps=-1), ValueError,
     r"^cosine: warmup_steps must be an int >= 0, got -1$"),
    (lambda: schedules.cosine(0.1, 10, warmup_begin_lr=-1.0), ValueError,
     r"^cosine: warmup_begin_lr must be"),
    (lambda: schedules.cosine(0.1, np.float64(10)), TypeError,
     r"^cosine: max_steps must be an int > 0, got float64 10\.0$"),
    (lambda: schedules.linear_warmup(-1, 0.1), ValueError,
     r"^linear_warmup: warmup_steps must be an int >= 0, got -1$"),
    (lambda: schedules.linear_warmup(5, -0.1), ValueError,
     r"^linear_warmup: after: lr must be a finite real number >= 0, got -0\.1$"),
    (lambda: schedules.linear_warmup(5, "x"), TypeError, r"^linear_warmup: after: lr must be"),
    (lambda: schedules.linear_warmup(5, 0.1, begin_lr=-1), ValueError,
     r"^linear_warmup: begin_lr must be a finite real number >= 0, got -1$"),
    (lambda: schedules.one_cycle(0.1, 0), ValueError,
     r"^one_cycle: total_steps must be an int > 0, got 0$"),
    (lambda: schedules.one_cycle(0.1, 100, pct_start=1.2), ValueError,
     r"^one_cycle: pct_start must be a finite real number with 0 <= pct_start <= 1, got 1\.2$"),
    (lambda: schedules.one_cycle(0.1, 100, div_factor=0), ValueError,
     r"^one_cycle: div_factor must be a finite real number > 0, got 0$"),
    (lambda: schedules.one_cycle(0.1, 100, final_div_factor=-1.0), ValueError,
     r"^one_cycle: final_div_factor must be"),
    (lambda: schedules.one_cycle(0.1, 100, anneal="cosine"), ValueError,
     r"^one_cycle: anneal must be 'cos' or 'linear', got 'cosine'$"),
    (lambda: schedules.one_cycle(0.1, 100, three_phase=1), TypeError,
     r"^one_cycle: three_phase must be a bool, got int 1$"),
    (lambda: schedules.one_cycle(0.1, 10, pct_start=0.1), ValueError,
     r"^one_cycle: pct_start \* total_steps must not be 1 \(the warm-up phase would last zero "
     r"steps\), got pct_start=0\.1, total_steps=10$"),
    (lambda: schedules.join([0.1, 0.2], []), ValueError,
     r"^join: boundaries must have one value fewer than schedules, got 2 schedules and "
     r"0 boundaries$"),
    (lambda: schedules.join([], []), ValueError, r"^join: schedules must not be empty$"),
    (lambda: schedules.join(0.1, []), TypeError, r"^join: schedules must be a list of schedules, "
                                                 r"got float 0\.1$"),
    (lambda: schedules.join([0.1, 0.2, 0.3], [5, 3]), ValueError,
     r"^join: boundaries must be a strictly increasing sequence of ints > 0, got \[5, 3\]$"),
    (lambda: schedules.join([0.1, [0.2, -1.0]], [5]), ValueError,
     r"^join: schedules\[1\]: lr sequence value 1 is -1\.0: must be >= 0$"),
]


@pytest.mark.parametrize("make, exc, message", ERRORS)
def test_errors(make, exc, message):
    with pytest.raises(exc, match=message) as info:
        make()
    assert type(info.value) is exc
