"""An independent reference implementation of SOAP as its authors' code runs it
(Vyas et al. 2024, github.com/nikhilvyas/SOAP, soap.py), in numpy/scipy float64.

Written from the authors' algorithm, NOT from specs/soap.py: it keeps their order of
operations (the first step fits the basis and updates nothing else, the first moment
lives in the eigenbasis and is rotated back before and forward after every statistics
update, the basis is re-sorted by estimated eigenvalue before each power iteration and
v permuted with it), where optgen rotates m only when the basis changes. The linear
algebra is scipy's (LAPACK eigh and QR), not the runtime's numpy.

For each parameter, per call of step() (k = 1, 2, ...):

    k = 1:  GG_d = (1 - sb) g g^T along each dimension d of a 2-D parameter whose length
            is <= max_precond_dim; Q_d = eigenvectors of GG_d, descending eigenvalues.
    k > 1:  t = k - 1;  g' = project(g)  (Q_0^T g Q_1; sides without Q: identity)
            m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2
            N = project_back(m / (sqrt(v) + eps));  normalize_grads: N / (1e-30 + rms(N))
            W = W - lr sqrt(1 - b2^t) / (1 - b1^t) N   (correct_bias; else lr)
            W = W - lr wd W
            m = project_back(m);  GG_d = sb GG_d + (1 - sb) (g g^T along d)
            if t % f == 0: for each d: est = diag(Q_d^T GG_d Q_d), order = argsort(-est),
                           v = v permuted along d by order, Q_d = QR(GG_d Q_d[:, order])
            m = project(m)

Usage: ``o = SoapOracle(params0, lr=..., betas=(b1, b2), ...); o.step(grads); o.w[i]``.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg as sla


class SoapOracle:
    def __init__(self, params0, lr=3e-3, betas=(0.95, 0.95), shampoo_beta=-1.0, eps=1e-8,
                 weight_decay=0.01, precondition_frequency=10, max_precond_dim=10000,
                 normalize_grads=False, correct_bias=True):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.sb = shampoo_beta if shampoo_beta >= 0 else betas[1]
        self.f, self.max_dim = precondition_frequency, max_precond_dim
        self.normalize, self.correct_bias = normalize_grads, correct_bias
        self.w = [np.array(p, np.float64) for p in params0]
        self.st: list[dict | None] = [None] * len(self.w)
        self.gaps: list[float] = []   # per fit and sort: its smallest relative gap

    # -- the eigenbasis: Q[d] for dimension d, None where not preconditioned -------------
    @staticmethod
    def project(x, Q, back: bool = False):
        """x in the basis (Q_0^T x Q_1), or back from it (Q_0 x Q_1^T)."""
        for d, q in enumerate(Q):
            if q is not None:
                x = np.moveaxis(np.tensordot(x, q, axes=([d], [int(back)])), -1, d)
        return x

    def accumulate(self, st, g):
        for d, gg in enumerate(st["GG"]):
            if gg is not None:
                other = [a for a in range(g.ndim) if a != d]
                outer = np.tensordot(g, g, axes=(other, other))
                st["GG"][d] = self.sb * gg + (1 - self.sb) * outer

    def fit(self, gg):
        """Eigenvectors by descending eigenvalue (the first basis)."""
        lam, q = sla.eigh(gg)
        self.note_gaps(lam[::-1])
        return q[:, ::-1]

    def note_gaps(self, descending):
        """The smallest gap between neighbours, relative to the largest: where it is far
        above the rounding of the compared runs, the basis is unique (up to signs)."""
        if len(descending) > 1:
            self.gaps.append(float(np.min(-np.diff(descending))
                                   / max(abs(descending[0]), 1e-300)))

    def power_iteration(self, st):
        for d, (gg, q) in enumerate(zip(st["GG"], st["Q"])):
            if gg is None:
                continue
            estimate = np.einsum("ij,ij->j", q, gg @ q)
            order = np.argsort(-estimate, kind="stable")
            self.note_gaps(estimate[order])
            st["v"] = np.take(st["v"], order, axis=d)
            st["Q"][d] = sla.qr(gg @ q[:, order])[0]

    # -- the step ------------------------------------------------------------------------
    def step(self, grads) -> None:
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float64)
            st = self.st[i]
            if st is None:
                sides = g.shape if g.ndim == 2 else ()
                st = self.st[i] = {
                    "t": 0, "m": np.zeros_like(g), "v": np.zeros_like(g),
                    "GG": [np.zeros((n, n)) if n <= self.max_dim else None for n in sides]}
                self.accumulate(st, g)
                st["Q"] = [None if gg is None else self.fit(gg) for gg in st["GG"]]
                continue
            st["t"] += 1
            t, Q = st["t"], st["Q"]
            g_rot = self.project(g, Q)
            st["m"] = self.b1 * st["m"] + (1 - self.b1) * g_rot
            st["v"] = self.b2 * st["v"] + (1 - self.b2) * g_rot * g_rot
            n = self.project(st["m"] / (np.sqrt(st["v"]) + self.eps), Q, back=True)
            if self.normalize:
                n = n / (1e-30 + np.sqrt(np.mean(n * n)))
            size = self.lr
            if self.correct_bias:
                size = size * np.sqrt(1 - self.b2 ** t) / (1 - self.b1 ** t)
            self.w[i] = self.w[i] - size * n
            self.w[i] = self.w[i] - self.lr * self.wd * self.w[i]
            st["m"] = self.project(st["m"], Q, back=True)
            self.accumulate(st, g)
            if t % self.f == 0:
                self.power_iteration(st)
            st["m"] = self.project(st["m"], st["Q"])

    def states(self, i: int) -> dict[str, np.ndarray]:
        """m, v and the statistics (L, R) as optgen names them; m and v in the basis."""
        st = self.st[i]
        out = {"m": st["m"], "v": st["v"]}
        for name, gg in zip(("L", "R"), st["GG"]):
            if gg is not None:
                out[name] = gg
        return out
