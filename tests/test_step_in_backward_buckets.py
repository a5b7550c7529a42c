"""The buckets of ``step_in_backward=True`` (optgen/torch/in_backward_buckets.py): small
parameters are stepped together, one multi-tensor launch per bucket (and kernel and
group), when the bucket's last gradient completes. Each run is compared with the same
optimizer stepped the ordinary way (``backward(); step(); zero_grad()``) on the same
data, over models whose gradients arrive across several buckets (the bucket size is
made small here: the models are small)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import optgen.torch as ot  # noqa: E402
from optgen.runtime import launch  # noqa: E402
from optgen.torch import in_backward_buckets as buckets  # noqa: E402


def stack(n: int = 8, width: int = 16) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(n):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def loss_of(net, i: int, width: int = 16):
    g = torch.Generator().manual_seed(i)
    return net(torch.randn(6, width, generator=g)).square().mean()


def groups(net, split: int = 8):
    """Two groups (the second's lr and decay differ); a bucket straddles them."""
    params = list(net.parameters())
    return [{"params": params[:split]},
            {"params": params[split:], "lr": 3e-3, "weight_decay": 0.0}]


def close(a, b, tol):
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(q.detach().numpy(), p.detach().numpy(), rtol=0, atol=tol)


class Launches:
    """Counts the runtime's kernel launches: multi-tensor lists and single tensors."""

    def __init__(self, monkeypatch):
        self.fused = self.single = 0
        for name, field in (("run_fused", "fused"), ("run", "single")):
            orig = getattr(launch.Launcher, name)

            def counted(*args, _orig=orig, _field=field, **kwargs):
                setattr(self, _field, getattr(self, _field) + 1)
                return _orig(*args, **kwargs)
            monkeypatch.setattr(launch.Launcher, name, counted)


@pytest.mark.parametrize("rule", ["adamw", "sgd"])
def test_buckets_equal_the_ordinary_step_one_launch_each(rule, monkeypatch):
    """8 layers, two groups, buckets of at most 2 KiB (a layer's weight and the bias of
    the layer before; the last bucket's two biases): 3 steps equal the ordinary step
    (float32 round-off; measured: bitwise); each bucket is one launch per group among
    its members (a multi-tensor list for two or more, counted); at each gradient's
    completion the gradients alive are exactly those of buckets not yet complete."""
    monkeypatch.setattr(buckets, "BUCKET_BYTES", 2048)
    make = {"adamw": lambda g, **k: ot.AdamW(g, lr=1e-2, weight_decay=0.1, **k),
            "sgd": lambda g, **k: ot.SGD(g, lr=0.05, momentum=0.9, **k)}[rule]
    nets = stack(), stack()
    opts = make(groups(nets[0])), make(groups(nets[1]), step_in_backward=True)
    params = list(nets[1].parameters())
    arrived, alive = [], []

    def seen(p):   # (after the optimizer's own hook)
        arrived.append(p)
        alive.append({id(q) for q in params if q.grad is not None})
    for p in params:
        p.register_post_accumulate_grad_hook(seen)
    count = Launches(monkeypatch)
    for i in range(3):
        loss_of(nets[0], i).backward()
        opts[0].step()
        opts[0].zero_grad()
        count.fused = count.single = 0
        arrived.clear(), alive.clear()
        loss_of(nets[1], i).backward()
        assert all(p.grad is None for p in params)
        of = opts[1]._buckets.of
        sizes = opts[1]._buckets.sizes()
        assert len(sizes) >= 4 and max(sizes) == 3, sizes
        in_group = {id(p): gi for gi, g in enumerate(opts[1].param_groups) for p in g["params"]}
        per = [{in_group[id(p)] for p in b.members} for b in {id(b): b for b in of.values()}.
               values()]
        runs = [[in_group[id(p)] for p in b.members].count(gi) for b in
                {id(b): b for b in of.values()}.values() for gi in {in_group[id(p)] for p in
                                                                    b.members}]
        assert any(len(g) == 2 for g in per)   # (a bucket straddles the groups)
        assert (count.fused, count.single) == (sum(n > 1 for n in runs), runs.count(1))
        waiting: set[int] = set()
        for p, seen in zip(arrived, alive):
            waiting.add(id(p))
            if waiting >= {id(q) for q in of[id(p)].members}:
                waiting -= {id(q) for q in of[id(p)].members}
            assert seen == waiting
    close(*nets, tol=1e-7)


class Branches(torch.nn.Module):
    """Buckets of 4352 bytes: {b, c} (b's three layers, then c's, in reverse
    registration order) and {a}."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.c, self.b = stack(3), torch.nn.Linear(16, 16), stack(3)

    def forward(self, x, use_c: bool):
        return self.b(x) + self.a(x) + (self.c(x) if use_c else 0)


def test_frozen_and_unreached_members(monkeypatch):
    """A frozen parameter (of a) does not hold its bucket: a's others step when their
    gradients complete, inside backward. A parameter the backward does not reach (c,
    every other step) holds its bucket: the end of the backward steps b then, and c not
    (as torch.optim leaves it). 4 steps equal the ordinary step."""
    from optgen.torch import in_backward
    monkeypatch.setattr(buckets, "BUCKET_BYTES", 4352)
    parts, closing = [], []   # (size, stepped by the end of the backward) of each part
    step_part, close_round = (in_backward.StepInBackward._step_part,
                              in_backward.StepInBackward._close_round)

    def recorded(self, params, grads):
        parts.append((len(params), bool(closing)))
        return step_part(self, params, grads)

    def closed(self):
        closing.append(1)
        try:
            return close_round(self)
        finally:
            closing.clear()
    monkeypatch.setattr(in_backward.StepInBackward, "_step_part", recorded)
    monkeypatch.setattr(in_backward.StepInBackward, "_close_round", closed)
    nets = Branches(), Branches()
    opts = ot.Adam(nets[0].parameters(), lr=1e-2), \
        ot.Adam(nets[1].parameters(), lr=1e-2, step_in_backward=True)
    for n in nets:
        n.a[2].weight.requires_grad_(False)
    for i in range(4):
        x = torch.randn(6, 16, generator=torch.Generator().manual_seed(i))
        nets[0](x, i % 2 == 0).square().mean().backward()
        opts[0].step()
        opts[0].zero_grad()
        parts.clear()
        nets[1](x, i % 2 == 0).square().mean().backward()
        assert all(p.grad is None for p in nets[1].parameters())
        assert sorted(parts) == ([(5, False), (8, False)] if i % 2 == 0 else
                                 [(5, False), (6, True)]), (i, parts)
    assert sorted(opts[1]._buckets.sizes()) == [6, 8]
    close(*nets, tol=1e-7)
    steps = {name: float(opts[1].state[p]["step"]) for name, p in nets[1].named_parameters()}
    assert steps["c.weight"] == 2 and steps["b.0.weight"] == steps["a.0.weight"] == 4
    assert steps["a.2.weight"] == 0


def test_bucket_layout():
    """Reverse registration order; a bucket is filled up to ``BUCKET_BYTES`` of
    gradients; a gradient of ``ALONE_BYTES`` or more is a bucket of its own and ends the
    bucket before it; parameters the hooks do not step are left out."""
    alone, small = buckets.ALONE_BYTES // 4, buckets.BUCKET_BYTES // 20   # (float32)
    sizes = [10, alone, 20, 30, small, small, small, small, small, 10, 40]
    params = [torch.zeros(n, requires_grad=True) for n in sizes]
    made = buckets.Buckets(params, lambda p: p is not params[10], version=0)
    at = {id(p): i for i, p in enumerate(params)}
    layout = sorted({id(b): [at[id(p)] for p in b.members] for b in made.of.values()}.values())
    assert layout == [[0], [1], [2, 3, 4], [5, 6, 7, 8, 9]], layout   # (5 smalls > the cap)
    assert id(params[10]) not in made.of
