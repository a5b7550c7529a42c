"""docs/writing-a-spec.md's first snippet, a spec file in a torch training loop
(``optgen.torch.make(path)`` with an lr scheduler), runs and prints what the page shows
(the snippet helpers are test_tutorial.py's)."""
import re

import pytest

from test_tutorial import ROOT, TUTORIAL, _blocks, _run_snippet, _section


def test_tutorial_torch_loop_snippet(monkeypatch):
    torch = pytest.importorskip("torch", reason="the snippet needs torch")
    monkeypatch.chdir(ROOT)    # the snippet names the spec by its path from the root
    section = _section(TUTORIAL, "## In short: a spec file in a torch training loop")
    code, = _blocks(section, "python")
    shown = _blocks(section, "console")[0]
    pattern = r"loss (\S+) from (\S+) \['g_prev', 'm', 's', 'step', 'v'\]\n"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)    # a tiny model: more threads only synchronize
    try:
        printed = _run_snippet(code)
    finally:
        torch.set_num_threads(threads)
    loss, start = map(float, re.fullmatch(pattern, printed).groups())
    shown_loss, shown_start = map(float, re.fullmatch(pattern, shown).groups())
    assert start == shown_start and loss < 1e-3 * start
    assert abs(loss - shown_loss) < 1e-3
