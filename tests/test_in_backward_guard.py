"""The step inside backward against what training loops do by default
(optgen/torch/in_backward_guard.py, runtime/composition.py's rows): a GradScaler,
``clip_grad_norm_`` after backward, plain gradient accumulation and the Hugging Face
Trainer's default clip are refused (or warned about) before the backward's first step
changes anything; ``loss_scale``, ``accumulating()`` with a GradScaler and the Trainer
with ``max_grad_norm=0`` and gradient accumulation compose, each equal to the ordinary
step. (DDP without ``opt.attach``: tests/test_step_in_backward.py's world-2 run.)"""
import warnings

import pytest

torch = pytest.importorskip("torch")
import optgen.torch as ot  # noqa: E402


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def loss_of(net, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    return torch.nn.functional.mse_loss(net(x), y)


def weights(net) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a: list, b: list, tol: float = 0.0) -> bool:
    return all(torch.allclose(x, y, rtol=0, atol=tol) for x, y in zip(a, b))


def refused(a: str, b: str) -> str:
    return f"{a} with {b} is refused"


def test_grad_scaler_is_refused_before_the_first_step():
    """``scaler.scale(loss).backward()`` with the step inside backward: refused at the
    first hook, naming loss_scale; no parameter moved (it would move by the scaled
    gradient: 1024 times the step)."""
    net = model()
    opt = ot.SGD(net.parameters(), lr=0.1, step_in_backward=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = weights(net)
    with pytest.raises(ValueError, match=refused("step_in_backward", "GradScaler") +
                       ".*use loss_scale=s"):
        scaler.scale(loss_of(net, 0)).backward()
    assert same(weights(net), before)
    assert all(int(opt.state[p]["step"]) == 0 for p in net.parameters())


def test_loss_scale_steps_inside_backward():
    """``loss_scale=s`` with the loss multiplied by s: each kernel divides the gradient
    by s, equal to the ordinary unscaled step (the scaling that steps in backward)."""
    nets = model(), model()
    plain = ot.SGD(nets[0].parameters(), lr=0.1, momentum=0.9)
    inside = ot.SGD(nets[1].parameters(), lr=0.1, momentum=0.9, loss_scale=1024.0,
                    step_in_backward=True)
    for i in range(5):
        loss_of(nets[0], i).backward()
        plain.step()
        plain.zero_grad()
        (loss_of(nets[1], i) * 1024.0).backward()
    assert same(weights(nets[0]), weights(nets[1]), 1e-6)


def test_accumulating_composes_with_grad_scaler():
    """Every micro-batch inside ``accumulating()``, then ``scaler.step(opt)``: the
    scaler unscales the held gradients, skips the step whose gradient has an inf (as
    with the ordinary optimizer) and opt.step() steps the others."""
    nets = model(), model()
    opts = ot.SGD(nets[0].parameters(), lr=0.1, momentum=0.9), \
        ot.SGD(nets[1].parameters(), lr=0.1, momentum=0.9, step_in_backward=True)
    scalers = [torch.amp.GradScaler("cpu", init_scale=256.0) for _ in nets]
    for i in range(4):
        for net, opt, scaler in zip(nets, opts, scalers):
            hook = net[0].bias.register_hook(lambda g: g * float("inf")) if i == 1 else None
            for k in range(2):
                with opt.accumulating() if opt is opts[1] else warnings.catch_warnings():
                    scaler.scale(loss_of(net, 2 * i + k) / 2).backward()
            if hook is not None:
                hook.remove()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    assert same(weights(nets[0]), weights(nets[1]), 1e-6)
    assert scalers[0].get_scale() == scalers[1].get_scale() == 128.0   # (the skipped step)
    assert int(opts[1].state[nets[1][0].weight]["step"]) == 3


def _clipping_loop(net, opt):
    loss_of(net, 0).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)   # (finds no gradient)
    opt.step()


def _loop(net, opt):
    loss_of(net, 0).backward()
    opt.step()


def test_clip_grad_norm_after_backward_warns_at_the_first_backward():
    """A loop that clips after backward (its code names clip_grad_norm_): a warning from
    the first backward, before its first step, naming the loop's function; once; a loop
    that does not clip gets none."""
    net = model()
    opt = ot.SGD(net.parameters(), lr=0.1, step_in_backward=True)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        net[0].weight.register_post_accumulate_grad_hook(   # (after the optimizer's hook)
            lambda p: got.append("a parameter stepped"))
        _clipping_loop(net, opt)
        _clipping_loop(net, opt)
    texts = [str(w.message) for w in got if isinstance(w, warnings.WarningMessage)]
    assert len(texts) == 1 and "step_in_backward with clip_grad_norm" in texts[0], texts
    assert "_clipping_loop names clip_grad_norm_" in texts[0] and "returns 0" in texts[0]
    assert isinstance(got[0], warnings.WarningMessage), "the warning came after a step"
    quiet = ot.SGD(model().parameters(), lr=0.1, step_in_backward=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _loop(model(), quiet)   # (a new model: the hooks of the optimizer just made)


def test_plain_accumulation_is_refused_before_the_second_backward_steps():
    """Two backwards with no opt.step()/zero_grad() between them, in a loop that calls
    zero_grad(): the second raises, naming accumulating(), before it steps anything;
    the same loop with the first micro-batch inside accumulating() trains."""
    net = model()
    opt = ot.SGD(net.parameters(), lr=0.1, step_in_backward=True)
    opt.zero_grad()
    (loss_of(net, 0) / 2).backward()
    after_first = weights(net)
    with pytest.raises(ValueError, match=refused("step_in_backward", "plain_accumulation") +
                       ".*inside opt.accumulating"):
        (loss_of(net, 1) / 2).backward()
    assert same(weights(net), after_first)
    assert all(int(opt.state[p]["step"]) == 1 for p in net.parameters())
    nets = model(), model()
    opts = ot.SGD(nets[0].parameters(), lr=0.1), \
        ot.SGD(nets[1].parameters(), lr=0.1, step_in_backward=True)
    for step in range(3):
        for opt in opts:
            opt.zero_grad()
        for k in range(2):
            (loss_of(nets[0], 2 * step + k) / 2).backward()
            with opts[1].accumulating() if k == 0 else warnings.catch_warnings():
                (loss_of(nets[1], 2 * step + k) / 2).backward()
        for opt in opts:
            opt.step()
    assert same(weights(nets[0]), weights(nets[1]), 1e-6)


def test_plain_accumulation_is_refused_at_the_first_step_call():
    """A loop that calls neither step() nor zero_grad() before its first accumulated
    step: opt.step() after the two micro-batches raises (each of them stepped)."""
    net = model()
    opt = ot.SGD(net.parameters(), lr=0.1, step_in_backward=True)
    for k in range(2):
        (loss_of(net, k) / 2).backward()
    with pytest.raises(ValueError, match=refused("step_in_backward", "plain_accumulation")):
        opt.step()


# -- the Hugging Face Trainer -------------------------------------------------------------
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 3)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.cross_entropy(self.lin(x), labels)}


def _trainer(net, opt, out: str, **args):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    data = [{"x": x[i], "labels": y[i]} for i in range(32)]
    targs = transformers.TrainingArguments(
        output_dir=out, max_steps=4, per_device_train_batch_size=4, learning_rate=0.1,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", seed=0,
        dataloader_num_workers=0, disable_tqdm=True, **args)
    return transformers.Trainer(model=net, args=targs, train_dataset=data,
                                optimizers=(opt, None))


def test_hf_trainer_with_its_default_clip_is_refused_before_the_first_step(tmp_path):
    net = Tiny()
    opt = ot.SGD(net.parameters(), lr=0.1, momentum=0.9, step_in_backward=True)
    before = weights(net)
    with pytest.raises(ValueError, match=refused("step_in_backward", "hf_trainer") +
                       ".*max_grad_norm=0"):
        _trainer(net, opt, str(tmp_path)).train()
    assert same(weights(net), before)


def test_hf_trainer_accumulates_with_max_grad_norm_0(tmp_path):
    """max_grad_norm=0, gradient_accumulation_steps=2: the non-final micro-batch is held
    (accelerate's sync_gradients), 4 Trainer steps are 4 optimizer steps, equal to the
    Trainer driving the ordinary step."""
    nets = Tiny(), Tiny()
    opts = [ot.SGD(n.parameters(), lr=0.1, momentum=0.9, step_in_backward=inside)
            for n, inside in zip(nets, (False, True))]
    for net, opt in zip(nets, opts):
        _trainer(net, opt, str(tmp_path), max_grad_norm=0.0,
                 gradient_accumulation_steps=2).train()
    assert int(opts[1].state[nets[1].lin.weight]["step"]) == 4
    assert same(weights(nets[0]), weights(nets[1]), 1e-6)


def test_the_backward_is_found_from_another_thread():
    """Hooks of CUDA tensors run on autograd's device threads: the roots and the loop's
    frames are then read from the thread that runs ``torch.autograd.backward`` (here a
    hook hands the lookup to a thread of its own)."""
    import threading
    from optgen.torch import in_backward_guard as guard
    net = model()
    found = []

    def hook(p):
        t = threading.Thread(target=lambda: found.append(guard._backward_stack()))
        t.start()
        t.join()

    net[0].bias.register_post_accumulate_grad_hook(hook)
    scaled = loss_of(net, 0) * torch.tensor(8.0)
    _backward_and_clip(scaled)
    (roots, callers), = found
    assert len(roots) == 1 and roots[0] is scaled and guard._scaled(roots)
    assert guard._clipping(callers).f_code is _backward_and_clip.__code__


def _backward_and_clip(loss):
    loss.backward()
    return torch.nn.utils.clip_grad_norm_
