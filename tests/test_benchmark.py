"""The timing harness (optgen.benchmark) that `optgen bench` and bench/ share, on fake
clocks: the interleaving order, warm-up, batches, medians and ratios, and goals judged
MET / MISSED / not run; and the suite's goal table read from made-up results. No
timing is asserted."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from optgen.benchmark import Contender, Goal, goal_line, interleave, ratio, rotations, wall_clock

BENCH = Path(__file__).resolve().parents[1] / "bench"


class FakeClock:
    """Each reading advances by the cost the last call charged."""

    def __init__(self) -> None:
        self.now, self.log = 0.0, []

    def __call__(self) -> float:
        return self.now

    def contender(self, name: str, cost: float, **kw) -> Contender:
        def step() -> None:
            self.log.append(name)
            self.now += cost
        return Contender(name, step, **kw)


def test_rotations_start_each_rep_one_contender_later():
    assert list(rotations(3, 4)) == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert list(rotations(1, 2)) == [[0], [0]]


def test_interleave_warms_up_then_rotates_and_times_each_call():
    clock = FakeClock()
    cs = [clock.contender("a", 1.0), clock.contender("b", 2.0), clock.contender("c", 4.0)]
    interleave(cs, reps=3, warmup=2, sample=wall_clock(clock))
    assert clock.log == ["a", "a", "b", "b", "c", "c",          # warm-up, untimed
                         "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert [c.times for c in cs] == [[1.0] * 3, [2.0] * 3, [4.0] * 3]


def test_blocked_order_gap_wake_and_inner_batches():
    clock, slept = FakeClock(), []
    a = clock.contender("a", 3.0, inner=4)
    b = clock.contender("b", 1.0)
    interleave([a, b], reps=2, warmup=0, order="blocked", gap_s=0.5, wake=True,
               sample=wall_clock(clock), sleep=slept.append)
    # blocked: a's reps, then b's; each sample: a pause, one untimed wake call, the batch
    assert clock.log == ["a"] * 10 + ["b"] * 4
    assert slept == [0.5] * 4
    assert a.times == [3.0, 3.0] and b.times == [1.0, 1.0]    # per call, batch / inner


def test_medians_ratios_and_bandwidth():
    c = Contender("x", lambda: None, bytes=2_000_000_000, times=[0.4, 0.1, 0.2, 5.0, 0.3])
    assert c.median == 0.3 and c.best == 0.1
    assert c.gbps(c.median) == pytest.approx(2 / 0.3)
    assert ratio([1.0, 3.0, 2.0], [4.0, 4.0]) == 0.5
    assert ratio([], [1.0]) is None and ratio([1.0], None) is None


@pytest.mark.parametrize("op,value,status", [
    ("<=", 1.0, "MET"), ("<=", 1.01, "MISSED"), ("<", 1.0, "MISSED"), ("<", 0.5, "MET"),
    (">=", 0.9, "MET"), (">=", 0.89, "MISSED"), (">", 0.9, "MISSED"), ("<=", None, "not run"),
])
def test_goal_judges_by_its_comparison(op, value, status):
    target = 1.0 if op in ("<=", "<") else 0.9
    assert Goal("g", op, target).judge(value) == status


def test_goal_record_and_line():
    rec = Goal("cold build", "<", 3.0, ".2f", " s").record(2.625, " [spin]")
    assert rec["goal"] == "cold build [spin]" and rec["status"] == "MET"
    assert goal_line(rec).split() == ["cold", "build", "[spin]", "2.62", "s", "<", "3", "s",
                                      "MET"]


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match="comparison '=='"):
        Goal("g", "==", 1.0)
    with pytest.raises(ValueError, match="order 'random'"):
        interleave([Contender("a", lambda: None)], 1, order="random")
    with pytest.raises(ValueError, match="reps >= 1"):
        interleave([Contender("a", lambda: None)], 0)


def test_suite_goals_read_the_workload_table(monkeypatch):
    """bench/workloads.py's goals, judged on made-up results: ratios of medians, the
    bandwidth over the limit, and 'not run' for a workload that was not measured."""
    monkeypatch.syspath_prepend(str(BENCH))
    for mod in ("report", "workloads", "goals", "contenders", "params", "lamb_rows"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    import report

    def wl(name, params, rows):
        return {"name": name, "params": params,
                "rows": [{"contender": c, "times_s": t} for c, t in rows.items()]}
    by = {"adam-10m": wl("adam-10m", 10_000_000, {"optgen adam": [0.006, 0.008, 0.007],
                                                  "torch fused": [0.007, 0.0069]}),
          "lamb-10m": wl("lamb-10m", 10_000_000, {"optgen lamb": [0.01],
                                                  "torch foreach LAMB": [0.02]})}
    lim = {"limit_Bps": 50e9}
    got = {g["goal"]: g for g in report.goals(by, lim)}
    assert got["Adam 10M: optgen / torch fused"]["value"] == pytest.approx(0.007 / 0.00695)
    assert got["Adam 10M: optgen / torch fused"]["status"] == "MISSED"
    frac = got["Adam 10M: optgen bytes/s / limit"]
    assert frac["value"] == pytest.approx(28 * 10_000_000 / 0.007 / 50e9) and frac["op"] == ">="
    assert got["LAMB 10M: optgen / torch foreach LAMB"]["status"] == "MET"
    assert got["LAMB 10M: optgen / optax.lamb jit"]["status"] == "not run"
    assert got["LAMB 10M: optgen time / 28-B limit time"]["value"] == pytest.approx(
        0.01 / (28 * 10_000_000 / 50e9))
    assert got["cold optgen build, new process wall"]["status"] == "not run"
    assert got["Adam 10M: optgen q8 states / torch fused fp32"]["status"] == "not run"
