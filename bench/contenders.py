"""The optimizer contenders: optgen's Adam and LAMB, torch's Adam (fused, foreach,
single-tensor), 8-bit Adams where installed, and numpy Adams. Each maker copies the
ParamSet it is given, so every contender steps its own arrays; ``weights`` returns the
final parameters in the set's order for the check against the workload's reference.
The LAMB contenders of torch and optax are in lamb_rows.py."""
from __future__ import annotations

import numpy as np

from optgen.benchmark import Contender
from params import ParamSet, concat, hf_decay

LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8
LAMB_EPS = 1e-6
# bytes an Adam or LAMB step must move per fp32 parameter, by state format: read w, g,
# m, v and write w, m, v (fp32: 28); bf16 m, v at 2 B each way; q8 codes at 1 B (absmax:
# 4 B per 256), q4 at 1/2 B (absmax: 4 B per 128), fp8 codes at 1 B (scale: 4 B per 256)
STATE_BYTES = {None: 28, "bf16": 20, "q8": 16, "q4": 14, "fp8": 16}
ADAM_B = STATE_BYTES[None]
FUSED, FOREACH, SINGLE = "torch fused", "torch foreach", "torch single-tensor"
OPTGEN, OPTGEN_FLAT = "optgen adam", "optgen adam (flatten)"
OPTGEN_PER = "optgen adam (per tensor)"      # multi_tensor=False: one call per tensor
LAMB_OPTGEN, LAMB_FLAT = "optgen lamb", "optgen lamb (flatten)"
NUMPY_EXPR, NUMPY_INPLACE = "numpy (out-of-place exprs)", "numpy (in-place, out=)"


def state_row(fmt: str) -> str:
    """The name of optgen Adam's row with ``fmt`` states."""
    return f"{OPTGEN} {fmt} states"


def make_optgen(ps: ParamSet, spec: str, name: str, flat: bool = False,
                state_format: str | None = None, multi_tensor: bool = True) -> Contender:
    """optgen.create(spec, ...): names and decay_filter=hf_decay where the set has names;
    ``flat``: each decay group's parameters and gradients in one buffer (optgen.flatten),
    so a group is one kernel call; ``state_format``: low-bit states ("bf16", "q8", "q4",
    "fp8"); ``multi_tensor=False``: loose tensors one call each (the default: one
    multi-tensor call per group)."""
    import optgen
    hyper = dict(lr=LR, beta1=BETA1, beta2=BETA2, eps=LAMB_EPS if spec == "lamb" else EPS,
                 weight_decay=ps.wd)
    if state_format is not None:
        hyper["state_format"] = state_format
    if not multi_tensor:
        hyper["multi_tensor"] = False
    order = list(range(len(ps.ws)))
    if flat:
        decay = [i for i in order if ps.decay[i]]
        rest = [i for i in order if not ps.decay[i]]
        order, ws, gs = decay + rest, [], []
        for idx in (decay, rest):
            if idx:
                ws += optgen.flatten([ps.ws[i] for i in idx])
                gs += optgen.flatten([ps.gs[i] for i in idx])
    else:
        ws, gs = [w.copy() for w in ps.ws], [g.copy() for g in ps.gs]
    if ps.names is None:
        opt = optgen.create(spec, ws, **hyper)
    else:
        opt = optgen.create(spec, {ps.names[i]: w for i, w in zip(order, ws)},
                            decay_filter=hf_decay, **hyper)
    back = np.argsort(order)       # the set's order, for the weight check
    note = (f"optgen.create({spec!r}{', names, decay_filter=hf_decay' if ps.names else ''}"
            f"{f', state_format={state_format!r}' if state_format else ''}"
            f"{', multi_tensor=False' if not multi_tensor else ''})"
            f"{'; optgen.flatten per decay group' if flat else ''}; opt.step(grads)")
    return Contender(name, lambda: opt.step(gs), STATE_BYTES[state_format] * ps.n, spec,
                     lambda: concat([ws[i] for i in back]), note=note)


# optgen.torch.AdamW rows: name -> (parameter dtype, runtime options, bytes moved per
# parameter). The last is the in-backward 5-byte configuration's step: bf16 weights
# (read, write 2 + 2), their split8 correction (1 + 1), q8 m and v (2 + 2, absmax
# aside) and the bf16 gradient (read 2): 12 B.
DROP_IN = "optgen.torch AdamW"
FIVE_BYTE = f"{DROP_IN} bf16+split8+q8 (in-backward's step)"
DROP_IN_ROWS = {f"{DROP_IN} fp32": ("float32", {}, ADAM_B),
                f"{DROP_IN} q8": ("float32", {"state_format": "q8"}, STATE_BYTES["q8"]),
                f"{DROP_IN} fp8": ("float32", {"state_format": "fp8"}, STATE_BYTES["fp8"]),
                FIVE_BYTE: ("bfloat16", {"master_format": "split8", "state_format": "q8"}, 12)}


def make_drop_in(torch, ps: ParamSet, name: str) -> Contender | None:
    """optgen.torch.AdamW (weight_decay 0: torch's Adam) on torch parameters of the row's
    dtype with ``.grad`` set once, timed as ``opt.step()``. The 5-byte row is the
    optimizer built without step_in_backward: its step runs the fused kernel that a
    step_in_backward hook runs for each parameter as its gradient completes (one
    parameter here), without the hook's host work and without the backward."""
    import optgen.torch as ot
    dtype, options, nbytes = DROP_IN_ROWS[name]
    ws = [torch.nn.Parameter(torch.from_numpy(w.copy()).to(getattr(torch, dtype)))
          for w in ps.ws]
    for w, g in zip(ws, ps.gs):
        w.grad = torch.from_numpy(g.copy()).to(getattr(torch, dtype))
    try:
        opt = ot.AdamW(ws, lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=0.0, **options)
    except (TypeError, ValueError) as e:
        print(f"{name}: not available ({type(e).__name__}: {str(e).splitlines()[0]})")
        return None
    opts = "".join(f", {k}={v!r}" for k, v in options.items())
    return Contender(name, opt.step, nbytes * ps.n, "adam",
                     lambda: concat(w.detach().float() for w in ws),
                     note=f"optgen.torch.AdamW({dtype} parameters, weight_decay=0{opts})"
                          ".step(), grads set once")


def torch_groups(torch, ps: ParamSet, requires_grad: bool):
    """(tensors, grads, groups) with two torch param groups when the set decays some."""
    ws = [torch.from_numpy(w.copy()) for w in ps.ws]
    if requires_grad:
        ws = [torch.nn.Parameter(w) for w in ws]
    gs = [torch.from_numpy(g.copy()) for g in ps.gs]
    decay = [w for w, d in zip(ws, ps.decay) if d]
    rest = [w for w, d in zip(ws, ps.decay) if not d]
    groups = [{"params": p, "weight_decay": wd} for p, wd in ((decay, ps.wd), (rest, 0.0)) if p]
    return ws, gs, groups


def make_torch_adam(torch, ps: ParamSet, name: str, **kw) -> Contender:
    """torch.optim.Adam(**kw), the gradients set once."""
    ws, gs, groups = torch_groups(torch, ps, requires_grad=True)
    for w, g in zip(ws, gs):
        w.grad = g
    opt = torch.optim.Adam(groups, lr=LR, betas=(BETA1, BETA2), eps=EPS, **kw)
    args = ", ".join(f"{k}={v}" for k, v in kw.items())
    return Contender(name, opt.step, ADAM_B * ps.n, "adam",
                     lambda: concat(w.detach() for w in ws),
                     note=f"torch.optim.Adam({len(groups)} group(s), {args}).step(), "
                          "grads set once")


def make_8bit(torch, ps: ParamSet, name: str) -> Contender | None:
    """bitsandbytes' Adam8bit or torchao's AdamW8bit on CPU tensors, where installed
    (neither is a dependency: pip install bitsandbytes torchao); None otherwise."""
    try:
        if name.startswith("bitsandbytes"):
            import bitsandbytes as bnb
            make = lambda p: bnb.optim.Adam8bit(p, lr=LR, betas=(BETA1, BETA2), eps=EPS)
        else:
            from torchao.optim import AdamW8bit
            make = lambda p: AdamW8bit(p, lr=LR, betas=(BETA1, BETA2), eps=EPS,
                                       weight_decay=0.0)
    except ImportError as e:
        print(f"{name}: not run ({e})")
        return None
    ws, gs, _ = torch_groups(torch, ps, requires_grad=True)
    for w, g in zip(ws, gs):
        w.grad = g
    opt = make(ws)
    return Contender(name, opt.step, STATE_BYTES["q8"] * ps.n, "adam",
                     lambda: concat(w.detach() for w in ws),
                     note=f"{type(opt).__module__}.{type(opt).__name__}.step() on CPU tensors")


def _bias(t: int) -> tuple[float, float]:
    """torch.optim.Adam's step size and 1/sqrt(bias correction 2) at step t."""
    return LR / (1 - BETA1 ** t), 1 / np.sqrt(1 - BETA2 ** t)


def make_numpy_expr(ps: ParamSet) -> Contender:
    """The textbook numpy Adam: out-of-place expressions, fresh temporaries on every line."""
    sts = [{"w": w.copy(), "m": np.zeros_like(w), "v": np.zeros_like(w)} for w in ps.ws]
    gs, t = [g.copy() for g in ps.gs], [0]

    def step():
        t[0] += 1
        step_size, inv_sqrt_bc2 = _bias(t[0])
        for st, g in zip(sts, gs):
            st["m"] = BETA1 * st["m"] + (1 - BETA1) * g
            st["v"] = BETA2 * st["v"] + (1 - BETA2) * g * g
            st["w"] -= step_size * st["m"] / (np.sqrt(st["v"]) * inv_sqrt_bc2 + EPS)
    return Contender(NUMPY_EXPR, step, ADAM_B * ps.n, "adam",
                     lambda: concat(st["w"] for st in sts),
                     note="m = b1*m + (1-b1)*g ... ; single-threaded ufuncs, new temporaries")


def make_numpy_inplace(ps: ParamSet) -> Contender:
    """numpy Adam with every ufunc writing into an existing array (out=, one scratch array)."""
    ws, gs = [w.copy() for w in ps.ws], [g.copy() for g in ps.gs]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    tmps, t = [np.empty_like(w) for w in ws], [0]

    def step():
        t[0] += 1
        step_size, inv_sqrt_bc2 = _bias(t[0])
        for w, g, m, v, tmp in zip(ws, gs, ms, vs, tmps):
            np.multiply(m, BETA1, out=m)
            np.multiply(g, 1 - BETA1, out=tmp)
            np.add(m, tmp, out=m)
            np.multiply(v, BETA2, out=v)
            np.multiply(g, g, out=tmp)
            np.multiply(tmp, 1 - BETA2, out=tmp)
            np.add(v, tmp, out=v)
            np.sqrt(v, out=tmp)
            np.multiply(tmp, inv_sqrt_bc2, out=tmp)
            np.add(tmp, EPS, out=tmp)
            np.divide(m, tmp, out=tmp)
            np.multiply(tmp, -step_size, out=tmp)
            np.add(w, tmp, out=w)
    return Contender(NUMPY_INPLACE, step, ADAM_B * ps.n, "adam", lambda: concat(ws),
                     note="13 ufuncs with out= per tensor, one scratch array; single-threaded")
