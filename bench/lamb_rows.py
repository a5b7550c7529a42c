"""The LAMB contenders other than optgen's: specs/lamb.py's rule written with torch's
``_foreach`` ops (torch has no LAMB of its own), and ``optax.lamb`` under ``jax.jit``."""
from __future__ import annotations

import math

from optgen.benchmark import Contender
from contenders import ADAM_B, BETA1, BETA2, LAMB_EPS, LR, torch_groups
from params import ParamSet, concat

LAMB_TORCH, LAMB_OPTAX = "torch foreach LAMB", "optax.lamb jit"


class Unavailable(Exception):
    """A contender whose library is not installed; the message says how to get it."""


class TorchForeachLamb:
    """LAMB with torch._foreach ops, the rule of specs/lamb.py (bias correction on, no
    norm bounds): r = m_hat / (sqrt(v_hat) + eps) + wd * w; ratio = ||w|| / ||r||, 1 when
    either norm is 0; w -= lr * ratio * r."""

    def __init__(self, torch, groups: list[tuple[list, list, float]]):
        self.torch, self.t = torch, 0
        self.groups = [(ws, gs, [torch.zeros_like(w) for w in ws],
                        [torch.zeros_like(w) for w in ws], wd) for ws, gs, wd in groups]

    def step(self) -> None:
        torch = self.torch
        self.t += 1
        bc1, bc2 = 1 - BETA1 ** self.t, 1 - BETA2 ** self.t
        for ws, gs, ms, vs, wd in self.groups:
            torch._foreach_mul_(ms, BETA1)
            torch._foreach_add_(ms, gs, alpha=1 - BETA1)
            torch._foreach_mul_(vs, BETA2)
            torch._foreach_addcmul_(vs, gs, gs, value=1 - BETA2)
            denom = torch._foreach_sqrt(vs)              # bc1*(sqrt(v)/sqrt(bc2) + eps)
            torch._foreach_mul_(denom, bc1 / math.sqrt(bc2))
            torch._foreach_add_(denom, bc1 * LAMB_EPS)
            r = torch._foreach_div(ms, denom)            # = m_hat / (sqrt(v_hat) + eps)
            del denom
            if wd:
                torch._foreach_add_(r, ws, alpha=wd)
            n_w = torch.stack(torch._foreach_norm(ws))
            n_r = torch.stack(torch._foreach_norm(r))
            ratio = torch.where((n_w > 0) & (n_r > 0), n_w / n_r, torch.ones_like(n_w))
            torch._foreach_mul_(r, (-LR * ratio).tolist())
            torch._foreach_add_(ws, r)


def make_torch_lamb(torch, ps: ParamSet) -> Contender:
    ws, gs, groups = torch_groups(torch, ps, requires_grad=False)
    index = {id(w): i for i, w in enumerate(ws)}
    opt = TorchForeachLamb(torch, [(g["params"], [gs[index[id(w)]] for w in g["params"]],
                                    g["weight_decay"]) for g in groups])
    return Contender(LAMB_TORCH, opt.step, ADAM_B * ps.n, "lamb", lambda: concat(ws),
                     note=f"torch._foreach_* LAMB (specs/lamb.py's rule), {len(groups)} group(s)")


def make_optax_lamb(ps: ParamSet) -> Contender:
    """optax.lamb under jax.jit, params and state donated (updated in place by XLA);
    Unavailable without jax and optax (not optgen dependencies)."""
    try:
        import jax
        import optax
    except ImportError as e:
        raise Unavailable(f"optax.lamb row skipped: {e} (pip install jax jaxlib optax)") \
            from None
    import jax.numpy as jnp
    tx = optax.lamb(LR, b1=BETA1, b2=BETA2, eps=LAMB_EPS, weight_decay=ps.wd,
                    mask=list(ps.decay))
    box = {"p": [jnp.array(w) for w in ps.ws]}
    box["s"] = tx.init(box["p"])
    gs = [jnp.array(g) for g in ps.gs]

    def update(params, state, grads):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    jitted = jax.jit(update, donate_argnums=(0, 1))

    def step():
        box["p"], box["s"] = jitted(box["p"], box["s"], gs)
        jax.block_until_ready(box["p"])
    return Contender(LAMB_OPTAX, step, ADAM_B * ps.n, "lamb", lambda: concat(box["p"]),
                     note=f"jax {jax.__version__}, optax {optax.__version__}: "
                          "jit(tx.update + apply_updates), donate_argnums=(0, 1); "
                          "wd mask = the decay groups; norms in fp32")
