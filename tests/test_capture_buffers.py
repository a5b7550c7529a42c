"""The ordering of capturable steps' scalar rows (runtime/capture.py), on a device that
runs late: ``LateDevice`` queues every copy, event and kernel the host issues and runs
them only when the host waits (or when the test lets it run), reading the pinned
buffers when a copy *runs*, as a GPU does. Each kernel records the scalars it read;
they must be its own step's, however far ahead the host runs, in eager steps, in
replays of a captured step after ``stage()``, and with eager steps between replays."""
import numpy as np
import pytest

from optgen.runtime.capture import RING, CaptureError, ScalarBuffers


class Event:
    fired = True


class LateDevice:
    """A stream: ops run in order, only when the host waits or ``run`` is called."""

    def __init__(self):
        self.queue, self.graph, self.read, self.log = [], [], [], []
        self.is_capturing = False

    def alloc(self, packed):
        host = packed.copy()
        return host, host                     # (the numpy view is the pinned buffer)

    def device_row(self, packed):
        return np.zeros_like(packed)

    def _issue(self, op):
        (self.graph if self.is_capturing else self.queue).append(op)

    def copy(self, dev, pinned):
        self._issue(("copy", dev, pinned))

    def launch(self, dev):                     # the kernel reading the row
        self._issue(("kernel", dev, None))

    def record(self, event):
        event = event or Event()
        event.fired = False
        self._issue(("record", event, None))
        return event

    def done(self, event):
        return event.fired

    def wait(self, event):
        self.log.append("wait")
        while not event.fired:
            self.run(1)

    def capturing(self):
        return self.is_capturing

    def idle(self):
        self.log.append("idle")
        self.run(len(self.queue))

    def replay(self):
        self.queue += self.graph

    def run(self, n):
        for kind, a, b in self.queue[:n]:
            if kind == "copy":
                a[...] = b                     # reads the pinned buffer now
            elif kind == "kernel":
                self.read.append(a.tolist())
            else:
                a.fired = True
        del self.queue[:n]


def scalars(k):
    return np.array([k, 10.0 * k])


def eager(rows, dev, k):
    dev.launch(rows.place(("p",), scalars(k), None, "numpy"))


def test_eager_steps_far_ahead_of_the_device_read_their_own_scalars():
    """The host issues 8 steps before the device runs any: each buffer is rewritten
    only after its copy ran (a wait once the ring is full), so every kernel reads its
    own step's scalars. (One buffer rewritten without a wait: every kernel read the
    last step's.)"""
    dev = LateDevice()
    rows = ScalarBuffers("opt", transfers=dev)
    for k in range(8):
        eager(rows, dev, k)
        assert dev.log.count("wait") == max(0, k + 1 - RING)
    dev.idle()
    assert dev.read == [scalars(k).tolist() for k in range(8)]


def test_a_device_that_keeps_up_is_never_waited_for():
    dev = LateDevice()
    rows = ScalarBuffers("opt", transfers=dev)
    for k in range(8):
        eager(rows, dev, k)
        dev.run(len(dev.queue))
    assert dev.log == [] and dev.read == [scalars(k).tolist() for k in range(8)]


def test_replays_read_the_staged_scalars_and_eager_steps_leave_the_graph_buffer_alone():
    dev = LateDevice()
    rows = ScalarBuffers("opt", transfers=dev)
    eager(rows, dev, 0)
    eager(rows, dev, 1)
    dev.idle()                                # (torch.cuda.graph synchronizes first)
    dev.is_capturing = True                   # capture the step of k = 2
    eager(rows, dev, 2)
    dev.is_capturing = False
    assert dev.queue == [] and [op[0] for op in dev.graph] == ["copy", "kernel"]
    dev.replay()
    want = [0, 1, 2]
    for k in range(3, 9):
        rows.staging = True                   # Optimizer.stage: wait, then write
        rows.wait()
        rows.place(("p",), scalars(k), None, "numpy")
        rows.staging = False
        dev.replay()
        want.append(k)
        if k % 2:                             # an eager step between replays, issued
            eager(rows, dev, 100 + k)         # before the replay has run
            want.append(100 + k)
    dev.idle()
    assert dev.read == [scalars(k).tolist() for k in want]
    assert dev.log.count("idle") == 1 + 6 + 1   # one wait per stage


def capture(rows, dev, k):
    """Capture the step of ``k`` in a graph of its own: the ops it records."""
    dev.idle()                                # (torch.cuda.graph synchronizes first)
    dev.is_capturing, dev.graph = True, []
    try:
        eager(rows, dev, k)
    finally:
        dev.is_capturing = False
    return dev.graph


def test_every_live_capture_replays_the_staged_scalars():
    """Two graphs captured from one optimizer (say one per input shape) both copy from
    their own pinned buffer: stage() writes both, so a replay of either reads the staged
    step's scalars, with eager steps in between. (stage() writing only the newest
    capture's buffer: the first graph replayed its capture's scalars, or an eager step's.)"""
    dev = LateDevice()
    rows = ScalarBuffers("opt", transfers=dev)
    eager(rows, dev, 0)
    first = capture(rows, dev, 1)
    second = capture(rows, dev, 2)
    for g in (first, second):
        dev.queue += g
    want = [0, 1, 2]
    for k in range(3, 12):
        rows.staging = True
        rows.wait()
        rows.place(("p",), scalars(k), None, "numpy")
        rows.staging = False
        dev.queue += first if k % 3 else second
        want.append(k)
        if k % 2:                             # eager steps must not touch either graph's
            eager(rows, dev, 100 + k)         # buffer, however many captures came
            want.append(100 + k)
    dev.idle()
    assert dev.read == [scalars(k).tolist() for k in want]


def test_captures_in_a_row_beyond_the_ring_are_an_error():
    """Each capture keeps one pinned buffer; a fresh one replaces it at the next step or
    stage outside a capture (a capture may not allocate pinned memory). With no step in
    between, the ring runs out after RING captures: a CaptureError, not a shared buffer."""
    dev = LateDevice()
    rows = ScalarBuffers("opt", transfers=dev)
    eager(rows, dev, 0)
    for k in range(RING):
        capture(rows, dev, k + 1)
    with pytest.raises(CaptureError, match="captures in a row"):
        capture(rows, dev, 9)
    eager(rows, dev, 10)                      # a step outside a capture refills the ring
    capture(rows, dev, 11)


def test_stage_without_a_captured_step_is_an_error():
    dev = LateDevice()
    rows = ScalarBuffers("opt", transfers=dev)
    eager(rows, dev, 0)
    rows.staging = True
    with pytest.raises(CaptureError, match="no captured step launches parameters"):
        rows.place(("p",), scalars(1), None, "numpy")


# -- capturable=True on the torch forms (optgen/torch/optim_form.py) ------------------------
CAPTURABLE = ["Adam", "NAdam", "ASGD", "Adadelta"]   # (each with its own torch message)


@pytest.mark.parametrize("name", CAPTURABLE)
def test_torch_forms_check_capturable_as_torch(name):
    """CPU parameters with capturable=True: torch.optim raises its AssertionError at
    the first step; so does the drop-in (the same message), before anything changes."""
    torch = pytest.importorskip("torch")
    import optgen.torch as ot

    def first_step(cls):
        p = torch.nn.Parameter(torch.arange(4.0))
        p.grad = torch.ones(4)
        opt = cls([p], lr=0.1, capturable=True)
        with pytest.raises(AssertionError) as err:
            opt.step()
        assert torch.equal(p, torch.arange(4.0))
        return str(err.value), opt
    theirs, _ = first_step(getattr(torch.optim, name))
    ours, opt = first_step(getattr(ot, name))
    assert ours == theirs and "capturable=True" in ours
    assert all(float(st["step"]) == 0 for st in opt.state.values())


def test_torch_form_stage_needs_capturable():
    torch = pytest.importorskip("torch")
    import optgen.torch as ot
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    with pytest.raises(ValueError, match=r"stage\(\) is for optimizers made with capturable"):
        ot.Adam([p]).stage()


def test_torch_form_refuses_unstaged_capture_where_torch_accepts_it(monkeypatch):
    """Where torch accepts capturable=True (a device its graphs capture: CUDA), a
    captured torch step replays by itself; optgen's needs opt.stage() before each
    replay, so the drop-in refuses capturable=True there without staged_capture=True,
    before anything changes. (torch's device list is widened to the CPU here, so the
    drop-in's rule runs on this machine; its runtime steps the CPU rows as numpy.)"""
    torch = pytest.importorskip("torch")
    import torch.optim.adam as torch_adam
    import optgen.torch as ot
    monkeypatch.setattr(torch_adam, "_get_capturable_supported_devices",
                        lambda supports_xla=True: ["cpu", "cuda"])
    p = torch.nn.Parameter(torch.arange(4.0))
    p.grad = torch.ones(4)
    opt = ot.Adam([p], lr=0.1, capturable=True)
    with pytest.raises(ValueError, match=r"Adam: capturable=True on cpu: .*staged_capture=True"):
        opt.step()
    assert torch.equal(p, torch.arange(4.0))
    staged = ot.Adam([p], lr=0.1, capturable=True, staged_capture=True)
    staged.step()
    ref = torch.optim.Adam([q := torch.nn.Parameter(torch.arange(4.0))], lr=0.1)
    q.grad = torch.ones(4)
    ref.step()
    assert torch.allclose(p, q)
