"""Test a new optimizer against its paper: examples/specs/adan.py vs Adan's Algorithm 1.

    python examples/new_optimizer.py                    # 100 steps, 5 shapes up to 1,000,003
    python examples/new_optimizer.py --quick            # 100 steps, 4 shapes up to 65,537 (CI)
    python examples/new_optimizer.py --quick --perturb beta2=0.921   # must fail

Builds the spec for this CPU (the first time; later runs load it from the cache) and
steps its compiled kernels on random gradients. Beside it, a numpy implementation of
Algorithm 1 of Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster
Optimizing Deep Models" (arXiv:2208.06677), written here from the paper and not from the
spec, steps the same gradients in float64. The script prints the largest error of the
parameters and of every state, relative to the largest value of that tensor, and exits
1 if one exceeds the tolerance (float32 2e-5, float64 1e-12). --perturb gives the paper
oracle a different hyperparameter value than the kernels, to see a mismatch caught.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

import optgen

SPEC = Path(__file__).resolve().parent / "specs" / "adan.py"
STEPS = 100
# float32: 100 steps of rounding; a rounded 1 + lr * weight_decay alone, divided by 100
# times, moves w by up to 100 * 6e-8 relative
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}
SHAPES = [(0,), (1,), (17,), (31, 37), (1_000_003,)]
QUICK_SHAPES = [(0,), (1,), (17,), (65_537,)]   # 65,537 > 32K elements: the parallel loop
SETTINGS = {   # hyperparameters in the spec's names
    "defaults": {},
    "busy": {"lr": 0.02, "beta1": 0.9, "beta2": 0.85, "beta3": 0.995, "eps": 1e-6,
             "weight_decay": 0.05},
}
DEFAULTS = {"lr": 1e-3, "beta1": 0.98, "beta2": 0.92, "beta3": 0.99, "eps": 1e-8,
            "weight_decay": 0.0}   # the official code's defaults (sail-sg/Adan)


class PaperAdan:
    """Algorithm 1 of the Adan paper, in its own notation, in float64.

    The paper's betas weigh the new term (beta1 = 0.02 means m = 0.98 m + 0.02 g):

        m_k = (1 - b1) m_{k-1} + b1 g_k
        v_k = (1 - b2) v_{k-1} + b2 (g_k - g_{k-1})
        n_k = (1 - b3) n_{k-1} + b3 [g_k + (1 - b2)(g_k - g_{k-1})]^2
        eta_k = eta / (sqrt(n_k) + eps)
        theta_{k+1} = (1 + lambda eta)^-1 [theta_k - eta_k (m_k + (1 - b2) v_k)]

    With the official implementation's conventions: m, v, n start at 0 and are divided
    by 1 - (1 - b)^k before use (eps outside the corrected sqrt), and g_0 = g_1.
    """

    def __init__(self, theta: np.ndarray, eta: float, b1: float, b2: float, b3: float,
                 eps: float, lam: float):
        self.theta = theta.astype(np.float64)
        self.eta, self.b1, self.b2, self.b3, self.eps, self.lam = eta, b1, b2, b3, eps, lam
        self.m = np.zeros_like(self.theta)
        self.v = np.zeros_like(self.theta)
        self.n = np.zeros_like(self.theta)
        self.g_prev = None
        self.k = 0

    def step(self, g: np.ndarray) -> None:
        b1, b2, b3 = self.b1, self.b2, self.b3
        g = g.astype(np.float64)
        g_prev = g if self.g_prev is None else self.g_prev
        self.k += 1
        self.m = (1 - b1) * self.m + b1 * g
        self.v = (1 - b2) * self.v + b2 * (g - g_prev)
        self.n = (1 - b3) * self.n + b3 * (g + (1 - b2) * (g - g_prev)) ** 2
        m_hat = self.m / (1 - (1 - b1) ** self.k)
        v_hat = self.v / (1 - (1 - b2) ** self.k)
        n_hat = self.n / (1 - (1 - b3) ** self.k)
        eta_k = self.eta / (np.sqrt(n_hat) + self.eps)
        self.theta = (self.theta - eta_k * (m_hat + (1 - b2) * v_hat)) / (1 + self.lam * self.eta)
        self.g_prev = g

    def states(self) -> dict[str, np.ndarray]:
        """The states under the spec's names (s is the paper's n)."""
        return {"m": self.m, "v": self.v, "s": self.n, "g_prev": self.g_prev}


def paper_oracle(theta: np.ndarray, hyper: dict) -> PaperAdan:
    h = {**DEFAULTS, **hyper}
    return PaperAdan(theta, eta=h["lr"], b1=1 - h["beta1"], b2=1 - h["beta2"],
                     b3=1 - h["beta3"], eps=h["eps"], lam=h["weight_decay"])


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|; NaN anywhere counts as an infinite error."""
    if want.size == 0:
        return 0.0
    err = np.abs(got.astype(np.float64) - want)
    if not np.all(np.isfinite(err)):
        return float("inf")
    return float(err.max() / max(np.abs(want).max(), np.finfo(np.float64).tiny))


def compare(art: optgen.Artifact, dtype: str, shapes: list, hyper: dict, perturb: dict,
            seed: int) -> dict:
    """Step the kernels and the paper oracle STEPS times; the largest error per tensor."""
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(s).astype(dtype) for s in shapes]
    # per-element gradient scales from 1e-3 to 10, a fixed mean and noise around it
    scales = [10.0 ** rng.uniform(-3, 1, s) for s in shapes]
    means = [rng.standard_normal(s) for s in shapes]
    opt = optgen.create(art, params, **hyper)
    oracles = [paper_oracle(p, {**hyper, **perturb}) for p in params]
    for _ in range(STEPS):
        grads = [(c * (mu + rng.standard_normal(mu.shape))).astype(dtype)
                 for c, mu in zip(scales, means)]
        opt.step(grads)
        for oracle, g in zip(oracles, grads):
            oracle.step(g)
    errors = {"w": max(relative_error(p, o.theta) for p, o in zip(opt.params, oracles))}
    for name in ("m", "v", "s", "g_prev"):
        errors[name] = max(relative_error(st[name], o.states()[name])
                           for st, o in zip(opt.state, oracles))
    return errors


def parse_perturb(items: list[str]) -> dict:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in DEFAULTS or not value:
            sys.exit(f"--perturb takes NAME=VALUE with NAME one of {', '.join(DEFAULTS)}, "
                     f"got {item!r}")
        out[name] = float(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes only (CI)")
    ap.add_argument("--perturb", action="append", default=[], metavar="NAME=VALUE",
                    help="give the paper oracle another value of a hyperparameter")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    perturb = parse_perturb(args.perturb)
    shapes = QUICK_SHAPES if args.quick else SHAPES

    start = time.perf_counter()
    art = optgen.get_artifact(str(SPEC))
    print(f"adan for llvm in {time.perf_counter() - start:.2f} s: {art.path}")
    print(f"shapes {', '.join(str(s) for s in shapes)}; {STEPS} steps"
          + (f"; oracle perturbed: {perturb}" if perturb else ""))
    failed = 0
    for dtype in ("float32", "float64"):
        for setting, hyper in SETTINGS.items():
            errors = compare(art, dtype, shapes, hyper, perturb, args.seed)
            worst = max(errors.values())
            ok = worst <= TOLERANCE[dtype]
            failed += not ok
            print(f"{dtype} {setting:8s} max relative error "
                  + "  ".join(f"{n} {e:.1e}" for n, e in errors.items())
                  + f"  (tolerance {TOLERANCE[dtype]:.0e}): {'ok' if ok else 'MISMATCH'}")
    print("kernels match the paper's Algorithm 1" if not failed else
          f"{failed} mismatch(es) against the paper's Algorithm 1")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
