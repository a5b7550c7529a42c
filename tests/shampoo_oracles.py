"""An independent reference implementation of Shampoo (with Adam grafting); SOAP's is
soap_oracle.py.

Plain numpy/scipy, float64, written from the paper's algorithm and the choices
docs/matrix.md states, NOT derived from specs/shampoo.py. The linear algebra is scipy's
(a Schur-based fractional matrix power for the roots), not the runtime's numpy eigh.
Per parameter, t its own step number (1, 2, ...); "refresh steps" are t = 1, 1 + f,
1 + 2 f, ... and run before that step's update.

Shampoo (Gupta et al. 2018; Distributed Shampoo's Adam grafting, Shi et al. 2023),
2-D W [R, C]:

    refresh:  PL = (L + epsilon I)^(-1/root),  PR = (R + epsilon I)^(-1/root)
    L = sb L + (1 - sb) g g^T  (sb = 1: L + g g^T);  R likewise with g^T g
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    a = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)          (the Adam graft)
    d = P ||a|| / ||P||,  P = PL (m / (1 - b1^t)) PR   if t >= start  else  a
    W = W (1 - lr wd) - lr d;           other ranks: d = a.
    A 2-D W with a side longer than max_preconditioner_dim is an "other rank": d = a.

Usage: ``o = ShampooOracle(params0, **hyper); o.step(grads); o.w[i], o.states(i)``.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg as sla

SHAMPOO_DEFAULTS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, shampoo_beta2=1.0,
                        epsilon=1e-12, root=4.0, weight_decay=0.0, precondition_frequency=20,
                        start_preconditioning_step=None, max_preconditioner_dim=8192)


def _hyper(defaults: dict, given: dict) -> dict:
    bad = set(given) - set(defaults)
    if bad:
        raise TypeError(f"unknown hyperparameters {sorted(bad)}")
    return {**defaults, **given}


def inverse_root(a: np.ndarray, root: float) -> np.ndarray:
    """a^(-1/root) of a symmetric positive definite a (scipy's Schur-Pade power)."""
    return np.real(sla.fractional_matrix_power(a, -1.0 / root))


class _Oracle:
    def __init__(self, params0, defaults, hyper, store_dtype=np.float64):
        self.h = _hyper(defaults, hyper)
        self.store = np.dtype(store_dtype)
        self.w = [np.array(p, np.float64) for p in params0]
        self.t = [0] * len(self.w)
        self.st = [self.init(w) for w in self.w]
        self.refreshed: list[bool] = []

    def due(self, i: int) -> bool:
        return self.t[i] % int(self.h["precondition_frequency"]) == 0

    def step(self, grads) -> None:
        self.refreshed.append(any(self.due(i) for i in range(len(self.w))))
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            if self.preconditioned(self.w[i]) and self.due(i):
                self.refresh(self.st[i])
            self.t[i] += 1
            self.update(i, g)

    def preconditioned(self, w) -> bool:
        return w.ndim == 2 and max(w.shape) <= self.h.get("max_preconditioner_dim", np.inf)

    def states(self, i: int) -> dict:
        return self.st[i]

    def round(self, x: np.ndarray) -> np.ndarray:
        """A host result stored in the parameter's dtype, as the runtime stores it."""
        return x.astype(self.store).astype(np.float64)


class ShampooOracle(_Oracle):
    def __init__(self, params0, store_dtype=np.float64, **hyper):
        super().__init__(params0, SHAMPOO_DEFAULTS, hyper, store_dtype)

    def init(self, w):
        st = {"m": np.zeros_like(w), "v": np.zeros_like(w)}
        if self.preconditioned(w):
            r, c = w.shape
            st.update(L=np.zeros((r, r)), R=np.zeros((c, c)), L_root=np.zeros((r, r)),
                      R_root=np.zeros((c, c)))
        return st

    def refresh(self, st):
        h = self.h
        for s, n in (("L", "L_root"), ("R", "R_root")):
            a = st[s] + h["epsilon"] * np.eye(len(st[s]))
            st[n] = self.round(inverse_root(a, h["root"]))

    def update(self, i, g):
        h, st, t, w = self.h, self.st[i], self.t[i], self.w[i]
        st["m"] = h["beta1"] * st["m"] + (1 - h["beta1"]) * g
        st["v"] = h["beta2"] * st["v"] + (1 - h["beta2"]) * g * g
        m_hat = st["m"] / (1 - h["beta1"] ** t)
        d = m_hat / (np.sqrt(st["v"] / (1 - h["beta2"] ** t)) + h["eps"])
        if self.preconditioned(w):
            sb = h["shampoo_beta2"]
            k = 1.0 if sb == 1 else 1 - sb
            p = st["L_root"] @ m_hat @ st["R_root"]
            st["L"] = sb * st["L"] + k * g @ g.T
            st["R"] = sb * st["R"] + k * g.T @ g
            start = h["start_preconditioning_step"] or h["precondition_frequency"] + 1
            if t >= start:
                d = p * (np.linalg.norm(d) / max(np.linalg.norm(p), 1e-30))
        self.w[i] = w * (1 - h["lr"] * h["weight_decay"]) - h["lr"] * d
