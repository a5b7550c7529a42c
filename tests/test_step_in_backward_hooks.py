"""``step_in_backward=True`` where a parameter's hook fires more than once a backward or
never (optgen/torch/in_backward.py, in_backward_hooks.py): reentrant activation
checkpointing with a weight shared by segments (ALBERT) and tied weights, accumulation
with a parameter the last micro-batch does not reach, freezing and unfreezing after
construction, and an optimizer replaced by a newer one on the same parameters. Each is
compared with torch.optim stepping a float32 copy the ordinary way
(``backward(); step(); zero_grad()``) on the same data."""
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import optgen.torch as ot  # noqa: E402
from optgen.torch import in_backward_buckets as buckets  # noqa: E402
from optgen.runtime import composition  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

TOL = 1e-6


class Albert(torch.nn.Module):
    """Token embedding (also the output layer: tied), one layer shared by three
    checkpointed segments (the third nested inside a checkpoint of its own)."""

    def __init__(self, reentrant: bool):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.shared = torch.nn.Embedding(12, 8), torch.nn.Linear(8, 8)
        self.reentrant = reentrant

    def layer(self, h):
        return torch.tanh(self.shared(h))

    def forward(self, i):
        h = self.emb(i)
        for _ in range(2):
            h = checkpoint(self.layer, h, use_reentrant=self.reentrant)
        h = checkpoint(lambda z: checkpoint(self.layer, z, use_reentrant=self.reentrant), h,
                       use_reentrant=self.reentrant)
        return h @ self.emb.weight.T


def pair(make, *opts):
    """Two equal models and an optimizer on each: ``opts[k](params)``."""
    nets = make(), make()
    return nets, [o(n.parameters()) for o, n in zip(opts, nets)]


def close(a, b, tol=TOL):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=0, atol=tol,
                                   err_msg=name)


def data(i: int, n: int = 6):
    g = torch.Generator().manual_seed(i)
    return torch.randint(0, 12, (n,), generator=g), torch.randint(0, 12, (n,), generator=g)


OPTIMIZERS = {   # name: (the plain path, the same rule stepping inside backward)
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1),
            lambda p: ot.SGD(p, lr=0.1, step_in_backward=True)),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
              lambda p: ot.AdamW(p, lr=1e-2, weight_decay=0.1, step_in_backward=True)),
}


@pytest.mark.parametrize("reentrant,alone", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("rule", list(OPTIMIZERS))
def test_checkpointed_shared_and_tied_weights_step_once(rule, reentrant, alone, monkeypatch):
    """A layer shared by three checkpointed segments (one nested) and a tied embedding:
    each parameter steps once a backward with its whole gradient (step count = number of
    backwards), equal to torch.optim; no gradient is left after a backward. The model's
    tensors are one bucket; ``alone``: each is a bucket of its own."""
    if alone:
        monkeypatch.setattr(buckets, "BUCKET_BYTES", 0)
    nets, opts = pair(lambda: Albert(reentrant), *OPTIMIZERS[rule])
    for it in range(3):
        for net, opt in zip(nets, opts):
            i, y = data(it)
            torch.nn.functional.cross_entropy(net(i), y).backward()
            if opt is opts[0]:
                opt.step()
                opt.zero_grad()
        assert all(p.grad is None for p in nets[1].parameters())
    close(*nets)
    assert [float(opts[1].state[p]["step"]) for p in nets[1].parameters()] == [3.0] * 3
    assert opts[1]._core.t == 3


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_segments_under_accumulation(reentrant):
    """Two micro-batches a step, the first under accumulating(): the segments' backwards
    add up, the stepping backward steps each parameter once with the sum (torch.optim:
    backward, backward, step)."""
    nets, opts = pair(lambda: Albert(reentrant), *OPTIMIZERS["adamw"])
    for it in range(2):
        for k in range(2):
            i, y = data(10 * it + k)
            torch.nn.functional.cross_entropy(nets[0](i), y).backward()
            with opts[1].accumulating() if k == 0 else _nothing():
                torch.nn.functional.cross_entropy(nets[1](i), y).backward()
        opts[0].step()
        opts[0].zero_grad()
        assert all(p.grad is None for p in nets[1].parameters())
    close(*nets)
    assert [float(opts[1].state[p]["step"]) for p in nets[1].parameters()] == [2.0] * 3


class Reused(torch.nn.Module):
    """A weight used inside a reentrant segment and again after it, outside."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w, self.inp, self.out = (torch.nn.Linear(8, 8), torch.nn.Linear(8, 8),
                                      torch.nn.Linear(8, 4))

    def forward(self, x):
        h = checkpoint(lambda z: torch.tanh(self.w(z)), self.inp(x), use_reentrant=True)
        return self.out(self.w(h))


@pytest.mark.parametrize("bucketed", [False, True])
def test_a_weight_inside_and_after_a_reentrant_segment(bucketed, monkeypatch):
    """Its outer gradient completes before the segment's backward adds to it. Stepped
    alone (buckets of one tensor each), it was stepped by then: the first backward says
    so (ValueError naming the parameter and the way out). In one bucket with the
    parameters whose gradients complete after the segment's backward (the default
    buckets of this model), its bucket waits, finds it held, and the end of the backward
    steps it with its whole gradient: no error. Every later backward holds it to its
    end and steps it once, equal to torch.optim from the same start."""
    if not bucketed:
        monkeypatch.setattr(buckets, "BUCKET_BYTES", 0)
    net = Reused()
    opt = ot.SGD(net.parameters(), lr=0.1, step_in_backward=True)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    ref = Reused()
    plain = torch.optim.SGD(ref.parameters(), lr=0.1)
    if bucketed:
        torch.nn.functional.mse_loss(ref(x), y).backward()
        plain.step()
        plain.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        close(ref, net)
    else:
        with pytest.raises(ValueError, match=re.escape(
                "parameters 0 (8, 8), 1 (8,) were stepped when their gradient completed "
                "in the outer")):
            torch.nn.functional.mse_loss(net(x), y).backward()
        ref.load_state_dict(net.state_dict())
    assert all(p.grad is None for p in net.parameters())
    before = float(opt.state[net.w.weight]["step"])
    for _ in range(2):
        torch.nn.functional.mse_loss(net(x), y).backward()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        plain.step()
        plain.zero_grad()
    close(ref, net)
    assert float(opt.state[net.w.weight]["step"]) == before + 2


class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.a, self.b = (torch.nn.Linear(8, 8), torch.nn.Linear(8, 4),
                                     torch.nn.Linear(8, 4))

    def forward(self, x, head):
        return (self.a if head == 0 else self.b)(torch.tanh(self.body(x)))


def micro(it: int, k: int):
    g = torch.Generator().manual_seed(10 * it + k)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


@pytest.mark.parametrize("rule", list(OPTIMIZERS))
def test_accumulated_parameter_the_last_micro_batch_does_not_reach(rule):
    """Head ``a`` only in the first (accumulated) micro-batch, head ``b`` only in the
    last: the stepping backward steps ``a`` at its end with what it accumulated."""
    nets, opts = pair(Heads, *OPTIMIZERS[rule])
    for it in range(3):
        for k in range(2):
            x, y = micro(it, k)
            torch.nn.functional.mse_loss(nets[0](x, k), y).backward()
            with opts[1].accumulating() if k == 0 else _nothing():
                torch.nn.functional.mse_loss(nets[1](x, k), y).backward()
        opts[0].step()
        opts[0].zero_grad()
        assert all(p.grad is None for p in nets[1].parameters())
    close(*nets)
    assert float(opts[1].state[nets[1].a.weight]["step"]) == 3


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8),
                               torch.nn.Tanh(), torch.nn.Linear(8, 4))


@pytest.mark.parametrize("rule", list(OPTIMIZERS))
def test_freeze_and_unfreeze_after_construction(rule):
    """The first layer frozen when the optimizers are made and unfrozen after; the middle
    one frozen after: the first steps every backward, the middle never (its weights and
    step count unchanged), as torch.optim; then the middle is unfrozen again mid-run."""
    nets = mlp(), mlp()
    for n in nets:
        n[0].requires_grad_(False)
    opts = [make(n.parameters()) for make, n in zip(OPTIMIZERS[rule], nets)]
    for n in nets:
        n[0].requires_grad_(True)
        n[2].requires_grad_(False)
    middle = nets[1][2].weight.detach().clone()
    for it in range(4):
        if it == 2:
            assert torch.equal(nets[1][2].weight, middle)
            assert float(opts[1].state[nets[1][2].weight]["step"]) == 0
            for n in nets:
                n[2].requires_grad_(True)
        for net, opt in zip(nets, opts):
            x, y = micro(it, 0)
            torch.nn.functional.mse_loss(net(x), y).backward()
            if opt is opts[0]:
                opt.step()
                opt.zero_grad()
    close(*nets)
    assert float(opts[1].state[nets[1][0].weight]["step"]) == 4
    assert float(opts[1].state[nets[1][2].weight]["step"]) == 2


def test_unfrozen_and_frozen_during_accumulation():
    """Micro-batch 0 under accumulating() with the first layer frozen and the last one
    trainable; then the first unfrozen and the last frozen for the stepping micro-batch:
    each steps with what it summed (the last layer: micro-batch 0's gradient, stepped at
    the end of the stepping backward), as torch.optim's backward, backward, step."""
    nets = mlp(), mlp()
    opts = [make(n.parameters()) for make, n in zip(OPTIMIZERS["adamw"], nets)]
    for it in range(2):
        for n in nets:
            n[0].requires_grad_(False)
            n[4].requires_grad_(True)
        for k in range(2):
            if k == 1:
                for n in nets:
                    n[0].requires_grad_(True)
                    n[4].requires_grad_(False)
            x, y = micro(it, k)
            torch.nn.functional.mse_loss(nets[0](x), y).backward()
            with opts[1].accumulating() if k == 0 else _nothing():
                torch.nn.functional.mse_loss(nets[1](x), y).backward()
        opts[0].step()
        opts[0].zero_grad()
        assert all(p.grad is None for p in nets[1].parameters())
    close(*nets)
    assert float(opts[1].state[nets[1][4].weight]["step"]) == 2


def test_a_replaced_optimizer():
    """A second in-backward optimizer on the same parameters (the first kept alive by its
    lr scheduler) steps them, equal to torch.optim; the first steps nothing more and its
    step() and accumulating() raise the composition table's refusal."""
    nets = mlp(), mlp()
    plain = torch.optim.SGD(nets[0].parameters(), lr=0.1)
    old = ot.SGD(nets[1].parameters(), lr=0.1, step_in_backward=True)
    sched = torch.optim.lr_scheduler.StepLR(old, 1, gamma=0.5)
    x, y = micro(0, 0)
    for net, opt in zip(nets, (plain, None)):
        torch.nn.functional.mse_loss(net(x), y).backward()
    plain.step()
    plain.zero_grad()
    sched.step()
    new = ot.SGD(nets[1].parameters(), lr=0.1, step_in_backward=True)
    for it in range(1, 4):
        x, y = micro(it, 0)
        for net in nets:
            torch.nn.functional.mse_loss(net(x), y).backward()
        plain.step()
        plain.zero_grad()
        new.zero_grad()   # (the loop's habit: nothing held, nothing to release)
        sched.step()
    close(*nets)
    assert float(old.state[nets[1][0].weight]["step"]) == 1
    assert float(new.state[nets[1][0].weight]["step"]) == 3
    text = composition.verdict("step_in_backward", "replaced_optimizer").text
    with pytest.raises(ValueError, match=re.escape(text)):
        old.step()
    with pytest.raises(ValueError, match=re.escape(
            composition.verdict("accumulating", "replaced_optimizer").text)):
        with old.accumulating():
            pass
    new.step()   # (the owner: nothing held, nothing to refuse)
