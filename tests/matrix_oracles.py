"""Independent reference implementations of the matrix optimizers THOR and Muon.

Plain numpy, float64 internally, written from the published rules and deliberately NOT
derived from specs/thor.py or specs/muon.py: a mistake in a spec (or in the runtime's
handling of THOR's statistics) then shows up as a disagreement with these oracles
(tests/test_matrix_optimizers.py).

THOR (Chen et al. 2020, arXiv:2011.14244; MindSpore ``nn.thor``, seed 001 lines
1257-1330), per parameter, with t the parameter's own step number (1, 2, ...):

* 2-D weight W [R, C] (torch layout [out, in]): at t = 1, 1 + frequency, 1 + 2*frequency,
  ... the inverses are refreshed from that step's statistics A = sum_batch a a^T (C x C,
  a = the layer's input) and G = sum_batch delta delta^T (R x R, delta = d(mean loss) /
  d(layer output))::

      A_inv = inv(A / batch_size + damping I_C)
      G_inv = inv(G * batch_size + damping I_R)

  (in float64; ``store_dtype`` rounds the stored inverses as optgen stores them, in the
  parameter's dtype), and on every step d = G_inv @ g @ A_inv (a Kronecker-factored
  natural gradient: (G ⊗ A)^-1 vec(g) with both factors damped);
* any other parameter: d = g;
* then d += weight_decay * w (where decay applies), enable_clip_grad: d /= max(||d||, 1)
  (MindSpore's ClipByNorm with clip value 1), m = momentum * m + d, and
  w -= lr * m, or with use_nesterov w -= lr * (d + momentum * m) (MindSpore ApplyMomentum).
  loss_scale divides the gradient first.

Muon (Keller Jordan 2024, torch.optim.Muon semantics but in full precision), for 2-D
W [R, C] with buffer B::

    B = momentum * B + (1 - momentum) * g                (torch: buf.lerp_(grad, 1 - momentum))
    u = (1 - momentum) * g + momentum * B  if nesterov else B
    X = u (transposed if R > C);  X /= max(||X||_F, ns_eps)
    ns_steps times:  A = X X^T;  X = ns_a X + (ns_b A + ns_c A A) X
    (transposed back);  scale = sqrt(max(1, R / C))  or, match_rms_adamw, 0.2 sqrt(max(R, C))
    w = w * (1 - lr * weight_decay) - lr * scale * X

and every other parameter takes torch.optim.AdamW's step with the same lr and
weight_decay (beta1, beta2, eps).

Usage::

    o = ThorOracle(params0, lr=0.05, damping=0.03, momentum=0.9, frequency=3)
    o.refresh_due                     # whether the next step refreshes (all parameters)
    o.step(grads, A=[A0, None], G=[G0, None])
    o.w[i], o.states(i)               # {"m", "A_inv", "G_inv"} (2-D) / {"m"}

    o = MuonOracle(params0, lr=0.02, momentum=0.95, nesterov=True)
    o.step(grads)
    o.w[i], o.states(i)               # 2-D: {"momentum_buffer"}; else {"exp_avg", "exp_avg_sq"}

or the one-call forms ``thor_oracle`` and ``muon_oracle`` (N steps, the final weights and
states). Unknown hyperparameters raise TypeError (catches typos in test tables).
"""
from __future__ import annotations

import math

import numpy as np

# MindSpore nn.thor: weight_decay 0.0, loss_scale 1.0, batch_size 32, use_nesterov False,
# enable_clip_grad False, frequency 100; lr, damping and momentum have no default.
THOR_DEFAULTS = dict(weight_decay=0.0, loss_scale=1.0, batch_size=32, use_nesterov=False,
                     enable_clip_grad=False, frequency=100)
THOR_REQUIRED = ("lr", "damping", "momentum")

# Keller Jordan's coefficients (torch.optim.Muon's ns_coefficients and eps).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
MUON_DEFAULTS = dict(lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.0,
                     match_rms_adamw=False, ns_a=NS_COEFFS[0], ns_b=NS_COEFFS[1],
                     ns_c=NS_COEFFS[2], ns_eps=NS_EPS, beta1=0.9, beta2=0.999, eps=1e-8)


def _hyper(name, given, defaults, required=()):
    unknown = [k for k in given if k not in defaults and k not in required]
    if unknown:
        raise TypeError(f"{name} oracle: unknown hyperparameter(s) {unknown}")
    missing = [k for k in required if k not in given]
    if missing:
        raise TypeError(f"{name} oracle: {missing} must be given (no default)")
    return {**defaults, **given}


def fro(x) -> float:
    x = np.asarray(x, np.float64)
    return float(np.sqrt(np.sum(x * x)))


# -- THOR -----------------------------------------------------------------------------
def thor_inverses(A, G, damping, batch_size):
    """(A_inv, G_inv) from one step's statistics, in float64."""
    A = np.asarray(A, np.float64)
    G = np.asarray(G, np.float64)
    A_inv = np.linalg.inv(A / batch_size + damping * np.eye(A.shape[0]))
    G_inv = np.linalg.inv(G * batch_size + damping * np.eye(G.shape[0]))
    return A_inv, G_inv


class ThorOracle:
    """THOR over a list of parameters; see the module docstring for the rule.

    ``decay``: per parameter, whether weight decay applies (default: all, which is what
    optgen does for parameters passed as a list). ``store_dtype``: dtype the inverses are
    rounded to when stored (None: kept in float64); the tests pass the parameters' dtype,
    as the rule stores them in it.
    """

    def __init__(self, params, *, decay=None, store_dtype=None, dtype=np.float64, **hyper):
        self.h = _hyper("thor", hyper, THOR_DEFAULTS, THOR_REQUIRED)
        if int(self.h["frequency"]) != self.h["frequency"] or self.h["frequency"] < 1:
            raise ValueError("thor oracle: frequency must be an int >= 1")
        self.dtype = dtype
        self.w = [np.array(p, dtype=dtype) for p in params]
        self.m = [np.zeros_like(w) for w in self.w]
        self.A_inv = [None] * len(self.w)
        self.G_inv = [None] * len(self.w)
        self.t = [0] * len(self.w)
        self.decay = [True] * len(self.w) if decay is None else list(decay)
        self.store_dtype = store_dtype
        self.refreshed = []          # per step: the parameter indices refreshed
        self.clipped = []            # per step and parameter: whether the clip acted
        self.d_norms = []            # per step and parameter: ||d|| before the clip

    def is_matrix(self, i):
        return self.w[i].ndim == 2

    def due(self, i) -> bool:
        return self.is_matrix(i) and self.t[i] % self.h["frequency"] == 0

    @property
    def refresh_due(self) -> bool:
        return any(self.due(i) for i in range(len(self.w)))

    def step(self, grads, A=None, G=None):
        h = self.h
        n = len(self.w)
        A = [None] * n if A is None else list(A)
        G = [None] * n if G is None else list(G)
        refreshed, clipped, norms = [], [], []
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            w = self.w[i]
            g = np.asarray(grad, np.float64).astype(self.dtype) / h["loss_scale"]
            if self.is_matrix(i):
                if self.due(i):
                    if A[i] is None or G[i] is None:
                        raise ValueError(f"thor oracle: parameter {i} needs A and G at step "
                                         f"{self.t[i] + 1}")
                    a_inv, g_inv = thor_inverses(A[i], G[i], h["damping"], h["batch_size"])
                    if self.store_dtype is not None:
                        a_inv = a_inv.astype(self.store_dtype)
                        g_inv = g_inv.astype(self.store_dtype)
                    self.A_inv[i] = a_inv.astype(self.dtype)
                    self.G_inv[i] = g_inv.astype(self.dtype)
                    refreshed.append(i)
                d = self.G_inv[i] @ g @ self.A_inv[i]
            else:
                d = g
            if self.decay[i] and h["weight_decay"]:
                d = d + h["weight_decay"] * w
            nd = fro(d)
            norms.append(nd)
            if h["enable_clip_grad"]:
                clipped.append(nd > 1.0)
                d = d / max(nd, 1.0)
            m = h["momentum"] * self.m[i] + d
            if h["use_nesterov"]:
                w = w - h["lr"] * (d + h["momentum"] * m)
            else:
                w = w - h["lr"] * m
            self.w[i], self.m[i] = w.astype(self.dtype), m.astype(self.dtype)
            self.t[i] += 1
        self.refreshed.append(refreshed)
        self.clipped.append(clipped)
        self.d_norms.append(norms)

    def states(self, i) -> dict:
        s = {"m": self.m[i]}
        if self.is_matrix(i) and self.A_inv[i] is not None:
            s.update(A_inv=self.A_inv[i], G_inv=self.G_inv[i])
        return s


def thor_oracle(params, grads, A=None, G=None, **hyper):
    """Run THOR for len(grads) steps: grads[k] is step k+1's list of gradients, A[k] / G[k]
    its statistics (lists with None for non-2-D parameters, or None on steps without).
    Returns (weights, states): lists over the parameters, float64."""
    o = ThorOracle(params, **hyper)
    for k, gs in enumerate(grads):
        o.step(gs, None if A is None else A[k], None if G is None else G[k])
    return o.w, [o.states(i) for i in range(len(o.w))]


# -- Muon -----------------------------------------------------------------------------
def newton_schulz(u, steps=5, coeffs=NS_COEFFS, eps=NS_EPS, dtype=np.float64):
    """Keller Jordan's quintic Newton-Schulz iteration towards the orthogonal factor of u
    (approximately U V^T of u's SVD; the singular values land in roughly [0.68, 1.2])."""
    a, b, c = coeffs
    X = np.asarray(u, dtype)
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / max(fro(X), eps)
    X = X.astype(dtype)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.T if tall else X


def muon_scale(shape, match_rms_adamw=False) -> float:
    R, C = shape[:2]
    if match_rms_adamw:
        return 0.2 * math.sqrt(max(R, C))
    return math.sqrt(max(1.0, R / C))


class MuonOracle:
    """Muon over a list of parameters (AdamW for those that are not 2-D)."""

    def __init__(self, params, *, dtype=np.float64, **hyper):
        self.h = _hyper("muon", hyper, MUON_DEFAULTS)
        self.dtype = dtype
        self.w = [np.array(p, dtype=dtype) for p in params]
        self.s = [{"momentum_buffer": np.zeros_like(w)} if w.ndim == 2 else
                  {"exp_avg": np.zeros_like(w), "exp_avg_sq": np.zeros_like(w)}
                  for w in self.w]
        self.t = [0] * len(self.w)
        self.last_update = [None] * len(self.w)     # the orthogonalized X of the last step

    def step(self, grads):
        h = self.h
        lr, wd = h["lr"], h["weight_decay"]
        for i, grad in enumerate(grads):
            if grad is None:
                continue
            self.t[i] += 1
            w = self.w[i]
            g = np.asarray(grad, np.float64).astype(self.dtype)
            s = self.s[i]
            if w.ndim == 2:
                mu = h["momentum"]
                B = mu * s["momentum_buffer"] + (1 - mu) * g
                u = (1 - mu) * g + mu * B if h["nesterov"] else B
                X = newton_schulz(u, h["ns_steps"], (h["ns_a"], h["ns_b"], h["ns_c"]),
                                  h["ns_eps"], self.dtype)
                self.last_update[i] = X
                scale = muon_scale(w.shape, h["match_rms_adamw"])
                w = w * (1 - lr * wd) - lr * scale * X
                self.s[i] = {"momentum_buffer": B.astype(self.dtype)}
            else:     # torch.optim.AdamW
                b1, b2, t = h["beta1"], h["beta2"], self.t[i]
                w = w * (1 - lr * wd)
                m = b1 * s["exp_avg"] + (1 - b1) * g
                v = b2 * s["exp_avg_sq"] + (1 - b2) * g * g
                denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + h["eps"]
                w = w - lr / (1 - b1 ** t) * m / denom
                self.s[i] = {"exp_avg": m.astype(self.dtype), "exp_avg_sq": v.astype(self.dtype)}
            self.w[i] = w.astype(self.dtype)

    def states(self, i) -> dict:
        return dict(self.s[i])


def muon_oracle(params, grads, **hyper):
    """Run Muon for len(grads) steps (grads[k]: step k+1's list of gradients).
    Returns (weights, states): lists over the parameters, float64."""
    o = MuonOracle(params, **hyper)
    for gs in grads:
        o.step(gs)
    return o.w, [o.states(i) for i in range(len(o.w))]
