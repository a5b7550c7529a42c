"""Independent reference implementations of Shampoo (with Adam grafting) and SOAP.

Plain numpy/scipy, float64, written from the papers' algorithms and the choices
docs/matrix.md states, NOT derived from specs/shampoo.py or specs/soap.py. The linear
algebra is scipy's (a Schur-based fractional matrix power for Shampoo's roots, LAPACK's
eigh and QR for SOAP's basis), not the runtime's numpy eigh. Per parameter, t its own
step number (1, 2, ...); "refresh steps" are t = 1, 1 + f, 1 + 2 f, ... and run before
that step's update.

Shampoo (Gupta et al. 2018; Distributed Shampoo's Adam grafting, Shi et al. 2023),
2-D W [R, C]:

    refresh:  PL = (L + epsilon I)^(-1/root),  PR = (R + epsilon I)^(-1/root)
    L = sb L + (1 - sb) g g^T  (sb = 1: L + g g^T);  R likewise with g^T g
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    a = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)          (the Adam graft)
    d = P ||a|| / ||P||,  P = PL (m / (1 - b1^t)) PR   if t >= start  else  a
    W = W (1 - lr wd) - lr d;           other ranks: d = a.

SOAP (Vyas et al. 2024, Algorithm 1, with the paper code's bias correction and decay):

    refresh:  Q = I while L = 0; the first fit of a nonzero L is its eigenvectors
              (descending eigenvalues); afterwards Q = QR(L Q)
    g' = QL^T g QR;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g'^2
    N = QL ((QL^T m QR) / (sqrt(v) + eps)) QR^T
    W = (W - lr sqrt(1 - b2^t) / (1 - b1^t) N) (1 - lr wd)
    L = sb L + (1 - sb) g g^T;  R = sb R + (1 - sb) g^T g        (sb: shampoo_beta or b2)
    other ranks: the same Adam with Q = I.

Usage: ``o = ShampooOracle(params0, **hyper); o.step(grads); o.w[i], o.states(i)``.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg as sla

SHAMPOO_DEFAULTS = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, shampoo_beta2=1.0,
                        epsilon=1e-12, root=4.0, weight_decay=0.0, precondition_frequency=20,
                        start_preconditioning_step=None)
SOAP_DEFAULTS = dict(lr=3e-3, beta1=0.95, beta2=0.95, eps=1e-8, weight_decay=0.01,
                     shampoo_beta=None, precondition_frequency=10, correct_bias=True)


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
            if self.w[i].ndim == 2 and self.due(i):
                self.refresh(self.st[i])
            self.t[i] += 1
            self.update(i, g)

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
        if w.ndim == 2:
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
        if w.ndim == 2:
            sb = h["shampoo_beta2"]
            k = 1.0 if sb == 1 else 1 - sb
            p = st["L_root"] @ m_hat @ st["R_root"]
            st["L"] = sb * st["L"] + k * g @ g.T
            st["R"] = sb * st["R"] + k * g.T @ g
            start = h["start_preconditioning_step"] or h["precondition_frequency"] + 1
            if t >= start:
                d = p * (np.linalg.norm(d) / max(np.linalg.norm(p), 1e-30))
        self.w[i] = w * (1 - h["lr"] * h["weight_decay"]) - h["lr"] * d


class SoapOracle(_Oracle):
    def __init__(self, params0, store_dtype=np.float64, **hyper):
        super().__init__(params0, SOAP_DEFAULTS, hyper, store_dtype)

    def init(self, w):
        st = {"m": np.zeros_like(w), "v": np.zeros_like(w)}
        if w.ndim == 2:
            r, c = w.shape
            st.update(L=np.zeros((r, r)), R=np.zeros((c, c)), Q_L=np.eye(r), Q_R=np.eye(c))
            st["fitted"] = False
        return st

    def states(self, i):
        return {k: v for k, v in self.st[i].items() if k not in ("fitted", "Q_L", "Q_R")}

    def refresh(self, st):
        if not st["L"].any():
            return
        for s, q in (("L", "Q_L"), ("R", "Q_R")):
            if st["fitted"]:
                st[q] = self.round(sla.qr(st[s] @ st[q])[0])
            else:
                st[q] = self.round(sla.eigh(st[s])[1][:, ::-1])
        st["fitted"] = True

    def update(self, i, g):
        h, st, t, w = self.h, self.st[i], self.t[i], self.w[i]
        b1, b2 = h["beta1"], h["beta2"]
        lr_t = h["lr"] * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) if h["correct_bias"] else h["lr"]
        st["m"] = b1 * st["m"] + (1 - b1) * g
        if w.ndim != 2:
            st["v"] = b2 * st["v"] + (1 - b2) * g * g
            n = st["m"] / (np.sqrt(st["v"]) + h["eps"])
        else:
            ql, qr = st["Q_L"], st["Q_R"]
            g_rot = ql.T @ g @ qr
            st["v"] = b2 * st["v"] + (1 - b2) * g_rot * g_rot
            n = ql @ ((ql.T @ st["m"] @ qr) / (np.sqrt(st["v"]) + h["eps"])) @ qr.T
            sb = b2 if h["shampoo_beta"] is None else h["shampoo_beta"]
            st["L"] = sb * st["L"] + (1 - sb) * g @ g.T
            st["R"] = sb * st["R"] + (1 - sb) * g.T @ g
        self.w[i] = (w - lr_t * n) * (1 - h["lr"] * h["weight_decay"])
