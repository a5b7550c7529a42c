"""Launch strategies (runtime/strategies/): each parameter's is chosen once, when its
kernel is prepared, kept in its record, and chosen again only when flags change; flat
runs are found once and kept until a multiplier (or a flag) changes."""
from __future__ import annotations

import numpy as np
import pytest

import optgen
from optgen.runtime import RowSparse, strategies


def _arrays(rng, shapes, dtype=np.float32):
    return [np.asarray(rng.standard_normal(s), dtype=dtype) for s in shapes]


def test_each_parameter_gets_its_strategy_when_prepared_and_keeps_it(rng):
    ws = _arrays(rng, [(6, 3), (4,)])
    opt = optgen.create("adam", ws, lr=0.01, backend="reference")
    assert [s.strategy for s in opt.records] == [None, None]   # not prepared yet
    gs = _arrays(rng, [(6, 3), (4,)])
    opt.step([gs[0], None])            # only a parameter with a gradient is prepared
    first = opt.records[0].strategy
    assert type(first) is strategies.PerTensor and opt.records[1].strategy is None
    opt.step(gs)
    assert opt.records[0].strategy is first                      # chosen once
    assert type(opt.records[1].strategy) is strategies.PerTensor
    opt.set_hyper(lr=0.02)             # not a flag: nothing is prepared again
    opt.step(gs)
    assert opt.records[0].strategy is first
    opt.set_hyper(use_nesterov=True)   # a flag: kernels and strategies are chosen again
    assert [s.strategy for s in opt.records] == [None, None]
    opt.step(gs)
    assert opt.records[0].strategy is not first
    assert opt.records[0].kernel.flags["use_nesterov"] is True


def test_lazy_strategy_steps_only_the_named_rows(rng):
    w = _arrays(rng, [(5, 3)])[0]
    before = w.copy()
    opt = optgen.create("lazyadam", [w], lr=0.1, lazy_update=True)
    opt.step([RowSparse([1, 3], np.ones((2, 3), np.float32))])
    assert type(opt.records[0].strategy) is strategies.Lazy
    changed = [i for i in range(5) if not np.array_equal(w[i], before[i])]
    assert changed == [1, 3]
    dense = optgen.create("lazyadam", [w.copy()], lr=0.1, lazy_update=False)
    dense.step([RowSparse([1], np.ones((1, 3), np.float32))])
    assert type(dense.records[0].strategy) is strategies.PerTensor


@pytest.mark.parametrize("spec,kind", [("adam", strategies.FlatRun),
                                       ("lamb", strategies.SegmentedRun)])
def test_flat_runs_are_found_once_and_again_after_a_multiplier(spec, kind, rng):
    shapes = [(4, 3), (7,), (2, 2)]
    ws = optgen.flatten(_arrays(rng, shapes))
    gs = optgen.flatten(_arrays(rng, shapes))
    opt = optgen.create(spec, ws, multi_tensor=False)   # (flat runs alone: issue 31's
    opt.step(gs)                                         # lists would take 0 and 2)
    runs = opt._current_runs()
    assert list(runs) == [0] and type(runs[0]) is kind and list(runs[0].indices) == [0, 1, 2]
    opt.step(gs)
    assert opt._current_runs() is runs                          # kept between steps
    assert [s.steps for s in opt.records] == [2, 2, 2]
    opt.set_lr_mult({1: 0.5})          # a multiplier splits the run
    assert opt._current_runs() is not runs and not opt._current_runs()
