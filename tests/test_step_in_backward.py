"""``step_in_backward=True`` (optgen/torch/in_backward.py): each parameter is stepped by
its post-accumulate-grad hook and its gradient released. Every run is compared with
the same optimizer stepped the ordinary way (``backward(); step(); zero_grad()``) on
the same data: parameters after 50 steps within 1e-6 (measured: bitwise equal), step
counts, lr schedulers, checkpoints, accumulation, refusals, a refused gradient, and
DDP at world size 2 (tests/in_backward_ddp_run.py) against one process."""
import os
import socket
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import optgen.torch as ot  # noqa: E402
from optgen.torch import in_backward_buckets as buckets  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-6


def model(wide: int = 16, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, wide), torch.nn.Tanh(),
                               torch.nn.Linear(wide, wide), torch.nn.Tanh(),
                               torch.nn.Linear(wide, 4)).to(dtype)


def two_groups(net, **second):
    """Two groups with different lr (and weight decay where the rule has one)."""
    first = list(net[0].parameters()) + list(net[2].parameters())
    return [{"params": first, "lr": 1e-2}, {"params": net[4].parameters(), **second}]


def batch(i: int, n: int = 16, dtype=torch.float32):
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, 8, generator=g).to(dtype), torch.randn(n, 4, generator=g).to(dtype)


def loss_of(net, i: int, dtype=torch.float32):
    x, y = batch(i, dtype=dtype)
    return torch.nn.functional.mse_loss(net(x).float(), y.float())


def close(a, b, tol=TOL):
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(p.detach().float().numpy(), q.detach().float().numpy(),
                                   rtol=0, atol=tol)


CASES = {   # name: (class, group-0 defaults, group-1 overrides, model width)
    "adam": (lambda: ot.Adam, dict(lr=3e-3, weight_decay=0.01), dict(lr=1e-3), 16),
    "adamw": (lambda: ot.AdamW, dict(lr=3e-3, weight_decay=0.1),
              dict(lr=1e-3, weight_decay=0.0), 16),
    "sgd": (lambda: ot.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
            dict(lr=0.02, weight_decay=0.0), 16),
    "lamb": (lambda: ot.LAMB, dict(lr=1e-2, weight_decay=0.01), dict(lr=3e-3), 16),
    # the middle weight has 4096 elements: q8 states with their block scales
    "adam-q8": (lambda: ot.Adam, dict(lr=3e-3, weight_decay=0.01, state_format="q8"),
                dict(lr=1e-3), 64),
}


@pytest.mark.parametrize("case", list(CASES))
def test_equal_to_the_ordinary_step(case):
    """50 steps, two groups, a LambdaLR stepping each iteration: the in-backward run
    equals the ordinary one; the gradients are released when their bucket completes
    (this model's six small tensors are one bucket: 1, ..., 5 held as the next
    completes, none after the last) and none is left after backward; no scheduler
    warning though the loop never calls opt.step()."""
    cls, kw, second, wide = CASES[case]
    cls = cls()
    nets = model(wide), model(wide)
    opts = cls(two_groups(nets[0], **second), **kw), \
        cls(two_groups(nets[1], **second), **kw, step_in_backward=True)
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, lambda k: 0.97 ** k) for o in opts]
    alive = []   # at each gradient's completion (after the optimizer's hook): grads held
    for p in nets[1].parameters():
        p.register_post_accumulate_grad_hook(lambda _: alive.append(
            sum(q.grad is not None for q in nets[1].parameters())))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # (torch's "lr_scheduler.step() before ...")
        for i in range(50):
            loss_of(nets[0], i).backward()
            opts[0].step()
            opts[0].zero_grad()
            loss_of(nets[1], i).backward()
            assert all(p.grad is None for p in nets[1].parameters())
            for s in scheds:
                s.step()
    close(*nets)
    assert alive == [1, 2, 3, 4, 5, 0] * 50
    for p, q in zip(nets[0].parameters(), nets[1].parameters()):
        assert float(opts[1].state[q]["step"]) == float(opts[0].state[p].get("step", 50))
    assert opts[1].param_groups[1]["lr"] == opts[0].param_groups[1]["lr"] != second["lr"]


def test_step_zero_grad_and_closure():
    """A loop keeping ``opt.step(); opt.zero_grad()`` trains as before (step() steps
    nothing new), and ``step(closure)`` runs the closure, whose backward steps."""
    nets = model(), model()
    ordinary = ot.AdamW(nets[0].parameters(), lr=1e-2)
    inside = ot.AdamW(nets[1].parameters(), lr=1e-2, step_in_backward=True)
    for i in range(6):
        def closure(net=nets[0], opt=ordinary):
            opt.zero_grad()
            loss = loss_of(net, i)
            loss.backward()
            return loss
        ordinary.step(closure)
        if i % 2:
            assert inside.step(lambda: _backward(nets[1], i)) is not None
        else:
            loss_of(nets[1], i).backward()
            assert inside.step() is None
            inside.zero_grad()
    close(*nets)
    assert inside.state[nets[1][0].weight]["step"] == 6


def _backward(net, i):
    loss = loss_of(net, i)
    loss.backward()
    return loss


def test_checkpoint_mid_run():
    """state_dict() after 5 steps, loaded into a new in-backward optimizer of a copy of
    the model: 5 more steps equal 10 uninterrupted ones (and torch's form loads back)."""
    nets = model(), model()
    whole = ot.Adam(nets[0].parameters(), lr=1e-2, step_in_backward=True)
    first = ot.Adam(nets[1].parameters(), lr=1e-2, step_in_backward=True)
    for i in range(5):
        loss_of(nets[0], i).backward()
        loss_of(nets[1], i).backward()
    sd = first.state_dict()
    resumed_net = model()
    resumed_net.load_state_dict(nets[1].state_dict())
    resumed = ot.Adam(resumed_net.parameters(), lr=1e-2, step_in_backward=True)
    resumed.load_state_dict(sd)
    for i in range(5, 10):
        loss_of(nets[0], i).backward()
        loss_of(resumed_net, i).backward()
    close(nets[0], resumed_net)
    assert resumed.state_dict()["state"][0]["step"] == 10


def test_add_param_group_and_a_parameter_without_gradient():
    """Hooks on a group added later; a parameter no loss reaches is not stepped (its
    state and step count stay as they were), as torch.optim leaves it."""
    nets = model(), model()
    opts = [ot.SGD(n[0].parameters(), lr=0.05, momentum=0.9, **kw)
            for n, kw in zip(nets, ({}, {"step_in_backward": True}))]
    unused = [torch.nn.Parameter(torch.ones(3)) for _ in nets]
    for i in range(8):
        if i == 3:
            for o, n, u in zip(opts, nets, unused):
                o.add_param_group({"params": [*n[2].parameters(), *n[4].parameters(), u],
                                   "lr": 0.02})
        loss_of(nets[0], i).backward()
        opts[0].step()
        opts[0].zero_grad()
        loss_of(nets[1], i).backward()   # (before i == 3 the later group's gradients
        # add up in both runs, without a hook: the first step of that group takes the sum)
        assert all(p.grad is None for g in opts[1].param_groups for p in g["params"])
    close(*nets)
    assert torch.equal(unused[1], torch.ones(3))
    assert "step" not in opts[1].state[unused[1]] or opts[1].state[unused[1]]["step"] == 0
    assert float(opts[1].state[nets[1][0].weight]["step"]) == 8


class Tied(torch.nn.Module):
    """An embedding whose weight is also the output layer's, and a checkpointed layer."""

    def __init__(self, reentrant: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.mid, self.reentrant = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), \
            reentrant

    def forward(self, i):
        h = torch.utils.checkpoint.checkpoint(lambda z: torch.tanh(self.mid(z)), self.emb(i),
                                              use_reentrant=self.reentrant)
        return h @ self.emb.weight.T


@pytest.mark.parametrize("reentrant", [False, True])
def test_tied_weights_and_checkpointing(reentrant):
    """A weight with two uses steps once with their summed gradient; a reentrant
    checkpoint's inner backward (a graph task of its own) counts no extra update."""
    nets = Tied(reentrant), Tied(reentrant)
    opts = [ot.AdamW(n.parameters(), lr=1e-2, **kw)
            for n, kw in zip(nets, ({}, {"step_in_backward": True}))]
    i, y = torch.tensor([1, 2, 3]), torch.tensor([3, 1, 2])
    for _ in range(6):
        torch.nn.functional.cross_entropy(nets[0](i), y).backward()
        opts[0].step()
        opts[0].zero_grad()
        torch.nn.functional.cross_entropy(nets[1](i), y).backward()
    close(*nets)
    assert opts[1]._core.t == 6 and float(opts[1].state[nets[1].emb.weight]["step"]) == 6


def test_accumulation():
    """k=3 micro-batches: under accumulating() for the first k-1 (the last one's
    backward steps), or for all k then opt.step(): both equal the ordinary
    accumulate-then-step loop."""
    nets = model(), model(), model()
    opts = [ot.Adam(n.parameters(), lr=1e-2, **kw) for n, kw in
            zip(nets, ({}, {"step_in_backward": True}, {"step_in_backward": True}))]
    for step in range(4):
        for k in range(3):
            i = 3 * step + k
            (loss_of(nets[0], i) / 3).backward()
            if k < 2:
                with opts[1].accumulating():
                    (loss_of(nets[1], i) / 3).backward()
                assert all(p.grad is not None for p in nets[1].parameters())
            else:
                (loss_of(nets[1], i) / 3).backward()
            with opts[2].accumulating():
                (loss_of(nets[2], i) / 3).backward()
        opts[0].step()
        opts[0].zero_grad()
        opts[2].step()
        assert all(p.grad is None for n in nets[1:] for p in n.parameters())
    close(nets[0], nets[1])
    close(nets[0], nets[2])
    assert opts[1].state_dict()["state"][0]["step"] == 4


@pytest.mark.parametrize("options, rule", [
    (dict(clip_global_norm=1.0), "clip_global_norm needs every gradient first"),
    (dict(nonfinite="skip"), "nonfinite='skip' needs every gradient first"),
    (dict(flat=True), "flat=True"),
    (dict(offload="cpu"), "offload"),
])
def test_refusals(options, rule):
    with pytest.raises(ValueError, match=f"step_in_backward steps each parameter as its "
                                         f"gradient completes; {rule}"):
        ot.AdamW(model().parameters(), step_in_backward=True, **options)


def test_more_refusals():
    with pytest.raises(TypeError, match="step_in_backward must be True or False"):
        ot.Adam(model().parameters(), step_in_backward=1)
    with pytest.raises(ValueError, match="step_in_backward.*capturable=True"):
        ot.Adam(model().parameters(), capturable=True, step_in_backward=True)
    with pytest.raises(ValueError, match="step_in_backward steps each parameter as its "
                                         "gradient completes; svrg_sgd takes grad_snapshot"):
        ot.make("svrg")(model().parameters(), step_in_backward=True)
    opt = ot.Adam(model().parameters())
    with pytest.raises(ValueError, match="accumulating\\(\\) is for optimizers made with "
                                         "step_in_backward=True"):
        with opt.accumulating():
            pass
    with pytest.raises(ValueError, match="attach\\(ddp_model\\) is for step_in_backward"):
        opt.attach(model())
    inside = ot.Adam(model().parameters(), step_in_backward=True)
    with pytest.raises(TypeError, match="attach takes a DistributedDataParallel model"):
        inside.attach(model())


def test_a_refused_gradient_changes_nothing_of_its_bucket(monkeypatch):
    """A NaN gradient with nonfinite='raise': backward raises FloatingPointError, that
    parameter and the others of its bucket, their states, step counts and gradients
    stay as they were; the buckets stepped before it in that backward stay stepped; the
    next backward trains on. (Buckets of 300 bytes: the last layer's weight and bias,
    then each other tensor alone.)"""
    monkeypatch.setattr(buckets, "BUCKET_BYTES", 300)
    net = model()
    opt = ot.Adam(net.parameters(), lr=1e-2, nonfinite="raise", step_in_backward=True)
    loss_of(net, 0).backward()
    bad = net[2].weight
    before = bad.detach().clone()
    states = {k: v.clone() for k, v in opt.state[bad].items()}
    last = net[4].weight.detach().clone()    # (its gradient completes before bad's)
    hook = bad.register_hook(lambda g: g * float("nan"))
    with pytest.raises(FloatingPointError, match="gradient 2 has NaN or Inf values"):
        loss_of(net, 1).backward()
    hook.remove()
    assert torch.equal(bad, before) and bad.grad is not None
    assert all(torch.equal(opt.state[bad][k], v) for k, v in states.items())
    assert not torch.equal(net[4].weight, last)
    bad.grad = None
    loss_of(net, 2).backward()
    assert float(opt.state[bad]["step"]) == 2 and float(opt.state[net[4].weight]["step"]) == 3
    bad, mate = net[4].weight, net[4].bias   # (one bucket)
    before = [bad.detach().clone(), mate.detach().clone()]
    hook = bad.register_hook(lambda g: g * float("nan"))
    with pytest.raises(FloatingPointError, match="gradient 4 has NaN or Inf values"):
        loss_of(net, 3).backward()
    hook.remove()
    assert torch.equal(bad, before[0]) and torch.equal(mate, before[1])
    assert mate.grad is not None and float(opt.state[mate]["step"]) == 3


def bf16_pair(width: int, **options):
    """20 steps of AdamW on a bfloat16 model, ordinary and in backward, with ``options``;
    the parameters must be equal bit for bit; returns (nets, opts)."""
    nets = model(width, torch.bfloat16), model(width, torch.bfloat16)
    opts = [ot.AdamW(n.parameters(), lr=1e-2, weight_decay=0.1, **options, **kw)
            for n, kw in zip(nets, ({}, {"step_in_backward": True}))]
    for i in range(20):
        loss_of(nets[0], i, torch.bfloat16).backward()
        opts[0].step()
        opts[0].zero_grad()
        loss_of(nets[1], i, torch.bfloat16).backward()
    close(*nets, tol=0)
    return nets, opts


def test_mixed_precision():
    """bfloat16 parameters with float32 master copies (multi_precision=True)."""
    nets, opts = bf16_pair(16, multi_precision=True)
    for p, q in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(opts[0].state[p]["master"], opts[1].state[q]["master"])


def test_split_master():
    """bfloat16 weights with an 8-bit compressed master (the weight and a correction
    state) and q8 states (the 5-byte configuration): the same parameters and states as
    the ordinary step, bit for bit (split16 too, measured; one case for the build time)."""
    nets, opts = bf16_pair(64, master_format="split8", state_format="q8")
    for p, q in zip(nets[0].parameters(), nets[1].parameters()):
        assert opts[0].state[p].keys() == opts[1].state[q].keys()
        assert all(torch.equal(v, opts[1].state[q][k]) for k, v in opts[0].state[p].items())


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.skipif(not (torch.distributed.is_available() and
                         torch.distributed.is_gloo_available()), reason="no gloo")
def test_ddp_world_2(tmp_path):
    """DDP (gloo, 2 processes, several buckets) with ``opt.attach(ddp)``: each rank
    trains on its half of every global batch, with one accumulated step, with DDP's
    gradients as views of its buckets and as copies; equal to one process on the whole
    batches with the ordinary step (and no gradient left after a backward); each
    bucket's step is one kernel launch, a multi-tensor list for buckets of several
    tensors. Without ``opt.attach``, each rank's first backward is refused before
    anything changes."""
    import in_backward_ddp_run as run
    single = run.train(world=1, rank=0)   # (first: the ranks then find its kernels built)
    port, env = _free_port(), dict(os.environ, OMP_NUM_THREADS="1")
    outs = [str(tmp_path / f"rank{r}.npz") for r in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "in_backward_ddp_run.py"),
                               str(r), port, outs[r]], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a DDP rank hung past 120 s")
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r} failed:\n{logs[r][-3000:]}"
    for out in outs:
        with np.load(out) as z:
            refused = str(z["refused"])
            parts, lists, alone = (int(z[f"count-{k}"]) for k in ("parts", "fused", "single"))
        # each bucket's step: one launch (several buckets of several tensors: lists)
        assert parts == lists + alone and lists > 0 and parts < 2 * run.STEPS * 6, \
            (parts, lists, alone)
        assert "step_in_backward with ddp is refused" in refused, refused
        assert "call opt.attach(ddp_model)" in refused, refused
        for views in (True, False):   # (DDP's gradients as views of its buckets, copies)
            with np.load(out) as z:
                got = [z[f"{views}-{i}"] for i in range(len(single))]
            for a, b in zip(single, got):
                np.testing.assert_allclose(b, a, rtol=0, atol=TOL)
