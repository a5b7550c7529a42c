"""bench/trainer_bench.py (issue 36): its GPT-2 list, its ratios with quiet-run tags, and
the suite's trainer goals judged on made-up results (no timing here)."""
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    for mod in ("trainer_bench", "report", "workloads", "goals", "contenders", "params",
                "lamb_rows"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    import trainer_bench
    return trainer_bench


def test_gpt2_small_list(bench):
    shapes = bench.gpt2_shapes()
    n = sum(a * (b[0] if b else 1) for a, *b in shapes)
    assert len(shapes) == 148 and n == 124_439_808    # GPT-2 small (tied lm head)


def _wl(rows):
    return {"rows": [{"contender": c, "times_s": t} for c, t in rows.items()]}


def test_ratio_reads_quiet_rows(bench):
    wl = _wl({"torch fused [quiet]": [0.010, 0.012, 0.011],
              "optgen default [quiet]": [0.009, 0.0099]})
    assert bench.ratio(wl, "optgen default [quiet]") == pytest.approx(0.00945 / 0.011)
    assert bench.ratio(wl, "optgen tvm pool") is None
    assert "trainer x: optgen default / torch fused  0.86  <= 1  MET" in \
        bench.goal_lines({"workloads": [dict(wl, name="x")]})[0]


def test_suite_trainer_goals(bench):
    import report
    by = {"trainer-mlp": {"name": "trainer-mlp", "params": 1, **_wl(
              {"torch fused": [0.008], "optgen default": [0.0107],
               "optgen default [quiet]": [0.001]})},
          "trainer-10m": {"name": "trainer-10m", "params": 1, **_wl(
              {"torch fused": [0.006], "optgen default": [0.0055]})}}
    got = {g["goal"]: g for g in report.goals(by, {"limit_Bps": 1.0})}
    assert got["trainer mlp: optgen default / torch fused"]["value"] == pytest.approx(1.3375)
    assert got["trainer mlp: optgen default / torch fused"]["status"] == "MISSED"
    assert got["trainer 10m: optgen default / torch fused"]["status"] == "MET"
    assert got["trainer gpt2: optgen default / torch fused"]["status"] == "not run"


def test_rows_say_which_pool_ran_and_compare_across_processes(bench):
    wl = {"rows": [
        {"contender": "torch fused [quiet]", "times_s": [1.0, 1.0], "fingerprint": [1.0, 2.0],
         "on_openmp": None},
        {"contender": "optgen default [quiet]", "times_s": [1.0] * 3,
         "fingerprint": [1.0, 2.5], "on_openmp": 1},
        {"contender": "optgen tvm pool [quiet]", "times_s": [1.0] * 3,
         "fingerprint": [1.0, 2.0], "on_openmp": 0}]}
    rows = bench.finish(wl)["rows"]
    assert [r["ran_on"] for r in rows] == ["-", "openmp 1/3, tvm 2/3", "tvm 3/3"]
    assert [r["max_abs_diff"] for r in rows] == [0.0, 0.5, 0.0]
