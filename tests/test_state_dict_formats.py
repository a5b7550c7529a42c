"""``opt.state_dict()`` / ``opt.load_state_dict`` (through torch.save and torch.load) with
every state format and master format (optgen/torch/state_load.py, optim_state.py,
torch_checkpoints.py).

A torch form's state_dict (torch's format) holds q8/q4/fp8 states as their float32
values with their block scales beside them (``exp_avg__absmax``): loading it codes the
values in those blocks again, so an optimizer loads its own state_dict exactly (the
same codes and scales, no conversion warning) and a resumed run is the uninterrupted
one bit for bit. A state_dict of another format converts (values quantized, codes'
values widened, bf16 <-> float32 cast) with one warning; codes of an optgen-format
state_dict, which do not say their format, are refused where this optimizer keeps
values. The Hugging Face Trainer (accelerate round-trips the state_dict at start) trains
and resumes with q8 states."""
import copy
import io
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import optgen.torch as ot  # noqa: E402
from optgen.core import formats  # noqa: E402

Q = dict(state_format_min_size=0)
CONFIGS = {   # name -> (parameter dtype, optgen options)
    "state_q8": (torch.float32, dict(state_format="q8", **Q)),
    "state_q4": (torch.float32, dict(state_format="q4", **Q)),
    "state_fp8": (torch.float32, dict(state_format="fp8", **Q)),
    "state_bf16": (torch.float32, dict(state_format="bf16", **Q)),
    "state_bf16sr": (torch.float32, dict(state_format="bf16sr", **Q)),   # (exhaustive)
    "state_mix": (torch.float32, dict(state_format={"exp_avg": "q8", "exp_avg_sq": "bf16"}, **Q)),
    "master_split16": (torch.bfloat16, dict(master_format="split16")),
    "master_split8": (torch.bfloat16, dict(master_format="split8")),
    "multi_precision": (torch.bfloat16, dict(multi_precision=True)),
    "offload": (torch.float32, dict(offload="cpu", state_format="q8", **Q)),
}


def _model(dtype, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8)).to(dtype)


def _train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(steps):
        model(torch.randn(16, 48, generator=g).to(dtype)).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def _through_file(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _states(opt):
    return [{n: v.detach().clone() for n, v in st.items() if isinstance(v, torch.Tensor)}
            for st in opt._core.state]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.exhaustive)
                                  if n in ("state_bf16sr", "master_split8") else n
                                  for n in CONFIGS])
def test_own_state_dict_resumes_bit_for_bit(name):
    dtype, kw = CONFIGS[name]
    a = _model(dtype)
    opt_a = ot.AdamW(a.parameters(), lr=1e-2, **kw)
    _train(a, opt_a, 3, seed=1)
    saved_model = copy.deepcopy(a.state_dict())
    saved_opt = _through_file(opt_a.state_dict())
    kept = _states(opt_a)
    b = _model(dtype, seed=5)
    opt_b = ot.AdamW(b.parameters(), lr=0.5, **kw)
    _train(b, opt_b, 1, seed=7)                      # its own history, overwritten next
    b.load_state_dict(saved_model)                   # (a trainer's order: model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # (no conversion: its own format)
        opt_b.load_state_dict(saved_opt)
    for i, (mine, theirs) in enumerate(zip(_states(opt_b), kept)):
        assert mine.keys() == theirs.keys()
        for n in mine:
            assert torch.equal(mine[n], theirs[n]), f"{name}: state {i}.{n} after the load"
    _train(a, opt_a, 3, seed=2)
    _train(b, opt_b, 3, seed=2)
    for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
        assert torch.equal(p, q), f"{name}: parameter {i} of the resumed run"


def test_seed_form_q8_state_dict_round_trips():
    """The seeds' forms keep q8 codes in their own (optgen-format) state_dict."""
    a = _model(torch.float32)
    opt = ot.seeds.AdamW(a.parameters(), lr=1e-2, state_format="q8", **Q)
    _train(a, opt, 2, seed=1)
    kept = _states(opt)
    sd = _through_file(opt.state_dict())
    assert sd["state"][0]["m"].dtype == torch.uint8
    _train(a, opt, 1, seed=3)
    opt.load_state_dict(sd)
    for mine, theirs in zip(_states(opt), kept):
        for n in mine:
            assert torch.equal(mine[n], theirs[n]), n


def _values(opt, i, n):
    st = opt._core.state[i]
    if n + formats.ABSMAX in st:
        fmt = formats.from_stored(opt._artifact.stored[n])
        return torch.from_numpy(fmt.dequantize(
            (st[n].numpy(), st[n + formats.ABSMAX].numpy()), tuple(opt._params[i].shape)))
    return st[n].float()


@pytest.mark.parametrize("src,dst", [("state_q8", None), (None, "state_q8"),
                                     ("state_q8", "state_q4"), ("state_bf16", None),
                                     (None, "state_bf16"), ("state_fp8", "state_q8")])
def test_a_state_dict_of_another_format_converts(src, dst):
    """Values carry over: the loaded states are the saved values in the new format (a
    warning says so where they are stored anew; q8's float32 values into float32 states
    are taken as they are)."""
    kw = lambda c: CONFIGS[c][1] if c else {}  # noqa: E731
    a = _model(torch.float32)
    opt_a = ot.AdamW(a.parameters(), lr=1e-2, **kw(src))
    _train(a, opt_a, 2, seed=1)
    b = copy.deepcopy(a)
    opt_b = ot.AdamW(b.parameters(), lr=1e-2, **kw(dst))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        opt_b.load_state_dict(_through_file(opt_a.state_dict()))
    said = [str(w.message) for w in said if "converted to this optimizer's" in str(w.message)]
    assert len(said) == (0 if (src, dst) == ("state_q8", None) else 1), said
    for i in range(len(opt_a._params)):
        for n in ("exp_avg", "exp_avg_sq"):
            want = _values(opt_a, i, n)
            st = opt_b._core.state[i]
            if n + formats.ABSMAX in st:            # quantized in this optimizer's blocks
                fmt = formats.from_stored(opt_b._artifact.stored[n])
                codes, scales = fmt.quantize(want.numpy())
                assert np.array_equal(st[n].numpy(), codes), f"{i}.{n}"
                assert np.array_equal(st[n + formats.ABSMAX].numpy(), scales), f"{i}.{n}"
            else:
                assert torch.equal(st[n], want.to(st[n].dtype)), f"{i}.{n}"
    _train(a, opt_a, 1, seed=2)
    _train(b, opt_b, 1, seed=2)                      # (it steps on)


def test_optgen_format_codes_into_values_are_refused():
    a = _model(torch.float32)
    opt_a = ot.AdamW(a.parameters(), lr=1e-2, **CONFIGS["state_q8"][1])
    _train(a, opt_a, 1, seed=1)
    opt_b = ot.AdamW(copy.deepcopy(a).parameters(), lr=1e-2)
    before = _states(opt_b)
    with pytest.raises(ValueError, match=r"state 0\.exp_avg holds block-quantized codes"):
        opt_b.load_state_dict(opt_a.state_dict(format="optgen"))
    for mine, theirs in zip(_states(opt_b), before):
        assert all(torch.equal(mine[n], theirs[n]) for n in mine)


def test_torch_optim_loads_and_continues_a_q8_state_dict():
    """torch.optim.AdamW takes the values (and keeps the block scales it ignores);
    its state_dict loads back into the q8 optimizer, quantized anew (the values moved)."""
    a = _model(torch.float32)
    opt_a = ot.AdamW(a.parameters(), lr=1e-2, **CONFIGS["state_q8"][1])
    _train(a, opt_a, 2, seed=1)
    theirs = torch.optim.AdamW(a.parameters(), lr=1e-2)
    theirs.load_state_dict(_through_file(opt_a.state_dict()))
    _train(a, theirs, 1, seed=2)
    with pytest.warns(UserWarning, match="float32 -> q8"):
        opt_a.load_state_dict(theirs.state_dict())
    p = next(a.parameters())
    fmt = formats.from_stored(opt_a._artifact.stored["exp_avg"])
    codes, _ = fmt.quantize(theirs.state[p]["exp_avg"].numpy())
    assert np.array_equal(opt_a._core.state[0]["exp_avg"].numpy(), codes)


def test_hf_trainer_trains_and_resumes_with_q8_states(tmp_path):
    """accelerate's AcceleratedOptimizer loads the state_dict at start; the Trainer's
    checkpoint (optimizer.pt) resumes to the uninterrupted run's weights."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from helpers import load_example
    from transformers import Trainer, TrainingArguments
    example = load_example("hf_trainer")

    def trainer(net, steps):
        opt = ot.AdamW(net.parameters(), lr=3e-3, state_format="q8", **Q)
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps, save_steps=2,
                                 per_device_train_batch_size=8, report_to=[], use_cpu=True,
                                 seed=0, dataloader_num_workers=0, disable_tqdm=True,
                                 save_strategy="steps", logging_steps=100)
        return Trainer(model=net, args=args, train_dataset=example.Counting(64, seed=1),
                       optimizers=(opt, None))
    net = example.model()
    trainer(net, 4).train()
    again = example.model()
    trainer(again, 4).train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-2"))
    for (name, p), q in zip(net.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), f"{name} differs after resuming"
