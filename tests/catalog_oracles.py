"""Independent reference implementations of every optimizer in docs/catalog.md.

Plain numpy, written from the rules in docs/catalog.md and cross-checked against the seed
documents (../shared/seeds: MXNet FTML/Adam/Optimizer, TinyMS/MindSpore optimizers) and
the papers / torch.optim. Deliberately NOT derived from specs/*.py: a mistake in a spec
then shows up as a disagreement with these oracles (tests/test_catalog_oracles.py).

Every oracle is a small class::

    o = ORACLES["rmsprop"](w0, lr=0.01, centered=True)      # float64 by default
    o.step(grad)                                             # dense gradient
    o.step_rows(indices, rows)                               # row-sparse, lazy (see below)
    o.w, o.states()                                          # parameter, {state name: value}

Hyperparameters not passed take the contract's defaults (``DEFAULTS``), so a test that
relies on a default also checks optgen's default. Unknown names raise TypeError (catches
typos in the test tables). ``dtype=np.float32`` runs the same rule in float32: only used
to check that a test case is well-conditioned enough for an rtol=1e-5 comparison of a
float32 kernel (a float32 oracle must itself pass it); the tests use float64.

Scalars are computed as Python floats (weak under NEP 50), arrays carry ``dtype``.
"""
from __future__ import annotations

import math

import numpy as np

# -- the contract's defaults -----------------------------------------------------------
PREPROC_DEFAULTS = dict(rescale_grad=1.0, clip_gradient=None, weight_decay=0.0)

DEFAULTS: dict[str, dict] = {
    "sgd": dict(lr=0.01, momentum=0.0, dampening=0.0, nesterov=False),
    "momentum": dict(lr=0.1, momentum=0.9, use_nesterov=False),
    "nag": dict(lr=0.1, momentum=0.9),
    "signum": dict(lr=0.01, momentum=0.9, wd_lh=0.0),
    "adam": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, use_nesterov=False),
    "lazyadam": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, use_nesterov=False),
    "adamweightdecay": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0),
    "adamw": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01),
    "adamax": dict(lr=0.002, beta1=0.9, beta2=0.999, eps=1e-8),
    "nadam": dict(lr=0.002, beta1=0.9, beta2=0.999, eps=1e-8, momentum_decay=0.004),
    "radam": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8),
    "adabelief": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-16),
    "adadelta": dict(lr=1.0, rho=0.9, eps=1e-6),
    "lion": dict(lr=1e-4, beta1=0.9, beta2=0.99, weight_decay=0.0),
    "ftml": dict(lr=0.0025, beta1=0.6, beta2=0.999, epsilon=1e-8),
    "ftrl": dict(lr=0.001, lr_power=-0.5, l1=0.0, l2=0.0, initial_accum=0.1),
    "rmsprop": dict(lr=0.1, decay=0.9, momentum=0.0, epsilon=1e-10, centered=False),
    "proximal_adagrad": dict(lr=0.001, l1=0.0, l2=0.0, initial_accum=0.1),
    "adagrad": dict(lr=0.001, initial_accum=0.1, eps=0.0, update_slots=True),
    "lamb": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0,
                 lower_bound=None, upper_bound=None, bias_correction=True),
    "lars": dict(coefficient=0.001, epsilon=1e-5, use_clip=False),   # plus the base's
    "adafactor": dict(lr=None, eps1=1e-30, eps2=1e-3, clip_threshold=1.0, decay_rate=0.8,
                      beta1=None, weight_decay=0.0, scale_parameter=True,
                      relative_step=True, warmup_init=False, compression=False),
    "cautious_adamw": dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0,
                           correct_bias=True),
    "mars_adamw": dict(lr=3e-3, beta1=0.95, beta2=0.99, eps=1e-8, gamma=0.025,
                       weight_decay=0.0, lr_1d_factor=1.0, beta1_1d=0.9, beta2_1d=0.95,
                       weight_decay_1d=0.1, optimize_1d=False),
    "schedule_free_adamw": dict(lr=0.0025, beta1=0.9, beta2=0.999, eps=1e-8,
                                weight_decay=0.0, warmup_steps=0, r=0.0,
                                weight_lr_power=2.0),
}
LARS_DEFAULT_BASE = "momentum"

# Specs whose weight_decay is not added to the gradient (their rule applies it).
DECOUPLED = {"adamweightdecay", "adamw", "lion", "lamb", "adafactor", "cautious_adamw",
             "mars_adamw", "schedule_free_adamw"}
# Accepted by every oracle but without effect on the dense rule (runtime options).
RUNTIME_OPTIONS = {"lazy_update"}
# signum and lion: an element whose c is within float32 round-off of 0 can legitimately
# take the other sign in a float32 kernel (Oracle.ambiguous records those elements).
# Relative slack (of the terms' magnitude) within which sign(c) counts as ambiguous.
SIGN_TOL = 1e-5


def preprocess(w, grad, rescale_grad, clip_gradient, weight_decay, dtype=np.float64):
    """MXNet: g = clip(rescale_grad * grad, -c, c) + weight_decay * w (clip only if c set)."""
    g = np.asarray(grad).astype(dtype) * rescale_grad
    if clip_gradient is not None:
        g = np.clip(g, -clip_gradient, clip_gradient)
    if weight_decay:
        g = g + weight_decay * w
    return g


def rms(x) -> float:
    x = np.asarray(x)
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


def norm(x) -> float:
    x = np.asarray(x)
    return float(np.sqrt(np.sum(x * x)))


class Oracle:
    """Base: hyperparameters, states, gradient preprocessing, dense and row-sparse steps.

    Subclasses set ``name``, ``array_states`` ({name: init}), ``scalar_states``
    ({name: init}) and implement ``rule(w, g, s, t) -> (w, s)`` (elementwise rules work
    on any sub-block of rows, which is how ``step_rows`` does lazy updates) and, for
    scalar states, ``scalar_rule(t)`` (run once a step before ``rule``).
    """

    name = ""
    array_states: dict = {}
    scalar_states: dict = {}
    decoupled = False

    def __init__(self, w0, *, dtype=np.float64, **hyper):
        known = {**PREPROC_DEFAULTS, **DEFAULTS[self.name]}
        unknown = [k for k in hyper if k not in known and k not in RUNTIME_OPTIONS]
        if unknown:
            raise TypeError(f"{self.name} oracle: unknown hyperparameter(s) {unknown}")
        self.h = {**known, **hyper}
        self.dtype = dtype
        self.w = np.array(w0, dtype=dtype)
        self.s = {n: np.full(self.w.shape, self._init(n, v), dtype=dtype)
                  for n, v in self.array_states.items()}
        self.sc = {n: float(self._init(n, v)) for n, v in self.scalar_states.items()}
        self.t = 0
        # elements whose sign(c) was ambiguous at float32 precision at some step
        self.ambiguous = np.zeros(self.w.shape, dtype=bool)

    def _init(self, name, value):
        """An init given as a str names the hyperparameter holding it (initial_accum)."""
        return self.h[value] if isinstance(value, str) else value

    def preprocess(self, w, grad):
        h = self.h
        wd = 0.0 if self.decoupled else h["weight_decay"]
        return preprocess(w, grad, h["rescale_grad"], h["clip_gradient"], wd, self.dtype)

    def step(self, grad):
        self.t += 1
        self.scalar_rule(self.t)
        g = self.preprocess(self.w, grad)
        self.w, self.s = self.rule(self.w, g, self.s, self.t)

    def step_rows(self, indices, rows):
        """Lazy row-sparse step: duplicate indices summed, only those rows change; the
        touched rows get exactly the dense rule (scalars such as t from this step)."""
        uniq, summed = sum_duplicate_rows(indices, rows, self.w.shape)
        self.t += 1
        self.scalar_rule(self.t)
        w_rows = self.w[uniq]
        g = self.preprocess(w_rows, summed)
        new_w, new_s = self.rule(w_rows, g, {n: v[uniq] for n, v in self.s.items()}, self.t)
        self.w = self.w.copy()
        self.w[uniq] = new_w
        for n, v in new_s.items():
            self.s[n] = self.s[n].copy()
            self.s[n][uniq] = v

    def scalar_rule(self, t):
        """Per-step scalar-state update; most rules have no scalar state."""

    def rule(self, w, g, s, t):
        """The elementwise rule: new (w, array states) from w, g, the states and t.
        Every subclass defines it, except LARS, which steps its base instead."""
        raise TypeError(f"the {self.name} oracle has no elementwise rule")

    def states(self) -> dict:
        return {**self.s, **self.sc}

    def _flag_sign(self, c, *terms):
        """Record elements whose sign(c) is not determined at float32 precision."""
        scale = sum(np.abs(x) for x in terms)
        amb = np.abs(c) <= SIGN_TOL * scale
        if amb.shape == self.ambiguous.shape:
            self.ambiguous |= amb


def sum_duplicate_rows(indices, rows, shape):
    """(unique sorted row numbers, their summed rows) of a row-sparse gradient."""
    indices = np.asarray(indices, dtype=np.int64)
    rows = np.asarray(rows, dtype=np.float64).reshape((len(indices),) + tuple(shape[1:]))
    uniq, inverse = np.unique(indices, return_inverse=True)
    summed = np.zeros((len(uniq),) + tuple(shape[1:]))
    np.add.at(summed, inverse.reshape(-1), rows)
    return uniq, summed


def densify(indices, rows, shape):
    """The dense gradient a row-sparse one stands for (zero rows, duplicates summed)."""
    uniq, summed = sum_duplicate_rows(indices, rows, shape)
    g = np.zeros(shape)
    g[uniq] = summed
    return g


# -- momentum family ---------------------------------------------------------------------
class SGD(Oracle):
    """torch.optim.SGD: b = g on the first step with momentum > 0, else
    b = momentum*b + (1-dampening)*g; d = g + momentum*b (nesterov) or b; w -= lr*d.
    momentum == 0: d = g and the buffer (and buffer_started) are left alone."""

    name = "sgd"
    array_states = {"momentum_buffer": 0.0}
    scalar_states = {"buffer_started": 0.0}

    def scalar_rule(self, t):
        # decided before the update: whether this step starts the buffer
        self._start = self.h["momentum"] > 0 and not self.sc["buffer_started"]
        if self.h["momentum"] > 0:
            self.sc["buffer_started"] = 1.0

    def rule(self, w, g, s, t):
        h = self.h
        mu = h["momentum"]
        if mu == 0:
            return w - h["lr"] * g, s
        b = g.copy() if self._start else mu * s["momentum_buffer"] + (1 - h["dampening"]) * g
        d = g + mu * b if h["nesterov"] else b
        return w - h["lr"] * d, {"momentum_buffer": b}


class Momentum(Oracle):
    """MindSpore Momentum: v = momentum*v + g; w -= lr*(g + momentum*v) (nesterov) or lr*v."""

    name = "momentum"
    array_states = {"moment": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        v = h["momentum"] * s["moment"] + g
        d = g + h["momentum"] * v if h["use_nesterov"] else v
        return w - h["lr"] * d, {"moment": v}


class NAG(Oracle):
    """MXNet 2 NAG (lr inside the buffer): s = momentum*s + lr*g; w -= momentum*s + lr*g."""

    name = "nag"
    array_states = {"momentum_buffer": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        b = h["momentum"] * s["momentum_buffer"] + h["lr"] * g
        return w - (h["momentum"] * b + h["lr"] * g), {"momentum_buffer": b}


class Signum(Oracle):
    """MXNet Signum: s = momentum*s + (1-momentum)*g; w = (1 - lr*wd_lh)*w - lr*sign(s)."""

    name = "signum"
    array_states = {"momentum_buffer": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        mu = h["momentum"]
        a, b = mu * s["momentum_buffer"], (1 - mu) * g
        c = a + b
        self._flag_sign(c, a, b)
        return (1 - h["lr"] * h["wd_lh"]) * w - h["lr"] * np.sign(c), {"momentum_buffer": c}


# -- Adam family ---------------------------------------------------------------------------
class Adam(Oracle):
    """MXNet/MindSpore Adam: lr_t = lr*sqrt(1-b2^t)/(1-b1^t); w -= lr_t*m/(sqrt(v)+eps);
    use_nesterov (MindSpore): w -= lr_t*(b1*m + (1-b1)*g)/(sqrt(v)+eps), m, v new."""

    name = "adam"
    array_states = {"m": 0.0, "v": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        lr_t = h["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        num = b1 * m + (1 - b1) * g if h["use_nesterov"] else m
        return w - lr_t * num / (np.sqrt(v) + h["eps"]), {"m": m, "v": v}


class LazyAdam(Adam):
    """Adam; a row-sparse gradient changes only its rows (``step_rows``)."""

    name = "lazyadam"


class AdamWeightDecay(Oracle):
    """MindSpore AdamWeightDecay (no bias correction, decoupled):
    u = m/(sqrt(v)+eps) + weight_decay*w; w -= lr*u."""

    name = "adamweightdecay"
    array_states = {"m": 0.0, "v": 0.0}
    decoupled = True

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        u = m / (np.sqrt(v) + h["eps"]) + h["weight_decay"] * w
        return w - h["lr"] * u, {"m": m, "v": v}


class AdamW(Oracle):
    """torch.optim.AdamW: w *= 1 - lr*wd; w -= lr/(1-b1^t) * m/(sqrt(v)/sqrt(1-b2^t) + eps)."""

    name = "adamw"
    array_states = {"m": 0.0, "v": 0.0}
    decoupled = True

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        w = w * (1 - h["lr"] * h["weight_decay"])
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + h["eps"]
        return w - h["lr"] / (1 - b1 ** t) * m / denom, {"m": m, "v": v}


class Adamax(Oracle):
    """torch.optim.Adamax: u = max(b2*u, |g| + eps); w -= lr/(1-b1^t) * m/u."""

    name = "adamax"
    array_states = {"m": 0.0, "u": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * s["m"] + (1 - b1) * g
        u = np.maximum(b2 * s["u"], np.abs(g) + h["eps"])
        return w - h["lr"] / (1 - b1 ** t) * m / u, {"m": m, "u": u}


class NAdam(Oracle):
    """torch.optim.NAdam (Dozat 2016) with the momentum-decay schedule mu_t."""

    name = "nadam"
    array_states = {"m": 0.0, "v": 0.0}
    scalar_states = {"mu_product": 1.0}

    def _mu(self, t):
        h = self.h
        return h["beta1"] * (1 - 0.5 * 0.96 ** (t * h["momentum_decay"]))

    def scalar_rule(self, t):
        self.sc["mu_product"] *= self._mu(t)

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        mu, mu_next, prod = self._mu(t), self._mu(t + 1), self.sc["mu_product"]
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        denom = np.sqrt(v / (1 - b2 ** t)) + h["eps"]
        w = (w - h["lr"] * (1 - mu) / (1 - prod) * g / denom
             - h["lr"] * mu_next / (1 - prod * mu_next) * m / denom)
        return w, {"m": m, "v": v}


class RAdam(Oracle):
    """torch.optim.RAdam (Liu et al. 2020): rectified when rho_t > 5, else plain momentum."""

    name = "radam"
    array_states = {"m": 0.0, "v": 0.0}

    @staticmethod
    def rho(t, beta2):
        rho_inf = 2 / (1 - beta2) - 1
        return rho_inf, rho_inf - 2 * t * beta2 ** t / (1 - beta2 ** t)

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        rho_inf, rho_t = self.rho(t, b2)
        if rho_t > 5:
            r = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf
                          / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            w = w - h["lr"] * m_hat * r * math.sqrt(1 - b2 ** t) / (np.sqrt(v) + h["eps"])
        else:
            w = w - h["lr"] * m_hat
        return w, {"m": m, "v": v}


class AdaBelief(Oracle):
    """Zhuang et al. 2020: s = b2*s + (1-b2)*(g-m)^2 + eps (m new);
    w -= lr/(1-b1^t) * m/(sqrt(s/(1-b2^t)) + eps)."""

    name = "adabelief"
    array_states = {"m": 0.0, "s": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * s["m"] + (1 - b1) * g
        d = g - m
        ss = b2 * s["s"] + (1 - b2) * d * d + h["eps"]
        w = w - h["lr"] / (1 - b1 ** t) * m / (np.sqrt(ss / (1 - b2 ** t)) + h["eps"])
        return w, {"m": m, "s": ss}


class AdaDelta(Oracle):
    """Zeiler 2012 / torch.optim.Adadelta."""

    name = "adadelta"
    array_states = {"acc_grad": 0.0, "acc_delta": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        rho, eps = h["rho"], h["eps"]
        acc_grad = rho * s["acc_grad"] + (1 - rho) * g * g
        delta = np.sqrt(s["acc_delta"] + eps) / np.sqrt(acc_grad + eps) * g
        acc_delta = rho * s["acc_delta"] + (1 - rho) * delta * delta
        return w - h["lr"] * delta, {"acc_grad": acc_grad, "acc_delta": acc_delta}


class Lion(Oracle):
    """Chen et al. 2023: c = b1*m + (1-b1)*g; w = w*(1 - lr*wd) - lr*sign(c);
    m = b2*m + (1-b2)*g."""

    name = "lion"
    array_states = {"m": 0.0}
    decoupled = True

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        a, b = b1 * s["m"], (1 - b1) * g
        c = a + b
        self._flag_sign(c, a, b)
        w = w * (1 - h["lr"] * h["weight_decay"]) - h["lr"] * np.sign(c)
        return w, {"m": b2 * s["m"] + (1 - b2) * g}


# -- FTML, FTRL, RMSProp, Adagrad family ---------------------------------------------------
class FTML(Oracle):
    """Seed 000 (MXNet FTML): v, d_t = (1-b1^t)/lr*(sqrt(v/(1-b2^t)) + eps),
    z = b1*z + (1-b1)*g - (d_t - b1*d_{t-1})*w, w = -z/d_t."""

    name = "ftml"
    array_states = {"d": 0.0, "v": 0.0, "z": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        v = b2 * s["v"] + (1 - b2) * g * g
        d = (1 - b1 ** t) / h["lr"] * (np.sqrt(v / (1 - b2 ** t)) + h["epsilon"])
        z = b1 * s["z"] + (1 - b1) * g - (d - b1 * s["d"]) * w
        return -z / d, {"d": d, "v": v, "z": z}


class FTRL(Oracle):
    """Seed 001 FTRL (MindSpore ApplyFtrl)."""

    name = "ftrl"
    array_states = {"accum": "initial_accum", "linear": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        p = -h["lr_power"]
        acc, lin = s["accum"], s["linear"]
        acc_new = acc + g * g
        lin = lin + g - (acc_new ** p - acc ** p) / h["lr"] * w
        quad = acc_new ** p / h["lr"] + 2 * h["l2"]
        w = np.where(np.abs(lin) > h["l1"], (np.sign(lin) * h["l1"] - lin) / quad, 0.0)
        return w.astype(self.dtype), {"accum": acc_new, "linear": lin}


class RMSProp(Oracle):
    """Seed 001 RMSProp (eps inside the sqrt, lr inside the moment)."""

    name = "rmsprop"
    array_states = {"mean_square": 0.0, "moment": 0.0, "mean_grad": 0.0}

    def rule(self, w, g, s, t):
        h = self.h
        dec = h["decay"]
        ms = dec * s["mean_square"] + (1 - dec) * g * g
        mg = s["mean_grad"]
        if h["centered"]:
            mg = dec * mg + (1 - dec) * g
            denom = np.sqrt(ms - mg * mg + h["epsilon"])
        else:
            denom = np.sqrt(ms + h["epsilon"])
        mom = h["momentum"] * s["moment"] + h["lr"] * g / denom
        return w - mom, {"mean_square": ms, "moment": mom, "mean_grad": mg}


class ProximalAdagrad(Oracle):
    """Seed 001 ProximalAdagrad: accum += g^2; prox = w - lr*g/sqrt(accum);
    w = sign(prox)/(1 + lr*l2) * max(|prox| - lr*l1, 0)."""

    name = "proximal_adagrad"
    array_states = {"accum": "initial_accum"}

    def rule(self, w, g, s, t):
        h = self.h
        acc = s["accum"] + g * g
        prox = w - h["lr"] * g / np.sqrt(acc)
        w = np.sign(prox) / (1 + h["lr"] * h["l2"]) * np.maximum(np.abs(prox) - h["lr"] * h["l1"], 0)
        return w, {"accum": acc}


class Adagrad(Oracle):
    """Seed 001 Adagrad (h + g^2; the seed's 'h + g' is a known typo) plus eps outside
    the sqrt: accum += g^2 if update_slots; w -= lr*g/(sqrt(accum) + eps)."""

    name = "adagrad"
    array_states = {"accum": "initial_accum"}

    def rule(self, w, g, s, t):
        h = self.h
        acc = s["accum"] + g * g if h["update_slots"] else s["accum"]
        return w - h["lr"] * g / (np.sqrt(acc) + h["eps"]), {"accum": acc}


# -- whole-tensor rules ----------------------------------------------------------------------
class LAMB(Oracle):
    """MXNet LAMB / MindSpore Lamb (decoupled): layer-wise trust ratio ||w||/||r||, ||w||
    clamped to [lower_bound, upper_bound] where set, ratio 1 when either norm is 0.
    (Seed 001 writes the bias correction m/b1^t, v/b2^t: a known typo for 1 - b^t.)"""

    name = "lamb"
    array_states = {"m": 0.0, "v": 0.0}
    decoupled = True

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        if h["bias_correction"]:
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        else:
            m_hat, v_hat = m, v
        r = m_hat / (np.sqrt(v_hat) + h["eps"]) + h["weight_decay"] * w
        n_w = norm(w)
        if h["lower_bound"] is not None:
            n_w = max(n_w, h["lower_bound"])
        if h["upper_bound"] is not None:
            n_w = min(n_w, h["upper_bound"])
        n_r = norm(r)
        ratio = n_w / n_r if n_w > 0 and n_r > 0 else 1.0
        self.last_ratio = ratio
        return w - h["lr"] * ratio * r, {"m": m, "v": v}


class LARS(Oracle):
    """MindSpore LARS wrapping a base optimizer (momentum by default, or any elementwise
    oracle here): on g = clip(rescale_grad*grad) (no weight decay), with wd the base's
    weight_decay, lambda = coefficient*||w|| / (||g|| + wd*||w|| + epsilon) if ||w|| > 0
    and ||g|| > 0 else 1; use_clip: lambda = min(lambda/lr, 1); the base rule then runs on
    lambda*(g + wd*w) without adding weight decay again."""

    name = "lars"

    def __init__(self, w0, *, base=LARS_DEFAULT_BASE, dtype=np.float64, **hyper):
        own = {k: hyper.pop(k) for k in list(hyper) if k in DEFAULTS["lars"]}
        pre = {k: hyper.pop(k) for k in list(hyper) if k in PREPROC_DEFAULTS}
        self.base_name = base
        # the base runs on the already transformed gradient: no preprocessing of its own
        self.base = ORACLES[base](w0, dtype=dtype, **hyper)
        self.h = {**PREPROC_DEFAULTS, **DEFAULTS["lars"], **pre, **own,
                  "lr": self.base.h["lr"]}
        self.dtype = dtype
        self.t = 0
        self.ambiguous = self.base.ambiguous

    @property
    def w(self):
        return self.base.w

    def states(self):
        return self.base.states()

    def step(self, grad):
        h = self.h
        self.t += 1
        b = self.base
        b.t += 1
        b.scalar_rule(b.t)
        w = b.w
        g = preprocess(w, grad, h["rescale_grad"], h["clip_gradient"], 0.0, self.dtype)
        wd = h["weight_decay"]
        n_w, n_g = norm(w), norm(g)
        if n_w > 0 and n_g > 0:
            lam = h["coefficient"] * n_w / (n_g + wd * n_w + h["epsilon"])
        else:
            lam = 1.0
        if h["use_clip"]:
            lam = min(lam / b.h["lr"], 1.0)
        self.last_lambda = lam
        b.w, b.s = b.rule(w, lam * (g + wd * w), b.s, b.t)

    def step_rows(self, indices, rows):  # pragma: no cover - not in the contract
        raise TypeError("lars has whole-tensor norms, so no lazy row-sparse rule")


class Adafactor(Oracle):
    """Shazeer & Stern 2018 in the fairseq/MindSpore form (decoupled weight decay).

    1-D: one second-moment vector; 2+-D: factored over the last two axes [..., R, C]
    (leading axes are a batch), row = EMA of mean over C, col = EMA of mean over R,
    V = row/mean_R(row) * col."""

    name = "adafactor"
    decoupled = True

    def __init__(self, w0, **kw):
        super().__init__(w0, **kw)
        shape = self.w.shape
        z = lambda s: np.zeros(s, dtype=self.dtype)   # noqa: E731
        if self.h["beta1"] is not None:
            self.s["exp_avg"] = z(shape)
        if len(shape) >= 2:
            self.s["exp_avg_sq_row"] = z(shape[:-1])
            self.s["exp_avg_sq_col"] = z(shape[:-2] + shape[-1:])
        else:
            self.s["exp_avg_sq"] = z(shape)

    def rule(self, w, g, s, t):
        h = self.h
        s = dict(s)
        if h["relative_step"]:
            rho = min(1e-6 * t if h["warmup_init"] else 1e-2, 1 / math.sqrt(t))
        else:
            if h["lr"] is None:
                raise ValueError("adafactor oracle: lr must be set when relative_step is off")
            rho = h["lr"]
        alpha = max(h["eps2"], rms(w)) * rho if h["scale_parameter"] else rho
        self.last_alpha = alpha
        beta2t = 1 - t ** (-h["decay_rate"])
        G = g * g + h["eps1"]
        if w.ndim >= 2:
            row = beta2t * s["exp_avg_sq_row"] + (1 - beta2t) * G.mean(axis=-1)
            col = beta2t * s["exp_avg_sq_col"] + (1 - beta2t) * G.mean(axis=-2)
            s["exp_avg_sq_row"], s["exp_avg_sq_col"] = row, col
            V = (row / row.mean(axis=-1, keepdims=True))[..., :, None] * col[..., None, :]
        else:
            V = beta2t * s["exp_avg_sq"] + (1 - beta2t) * G
            s["exp_avg_sq"] = V
        U = g / np.sqrt(V)
        U = U / max(1.0, rms(U) / h["clip_threshold"])
        U = alpha * U
        if h["beta1"] is not None:
            U = h["beta1"] * s["exp_avg"] + (1 - h["beta1"]) * U
            s["exp_avg"] = U
        if h["compression"]:  # MindSpore: running averages stored as float16
            s = {n: v.astype(np.float16).astype(self.dtype) for n, v in s.items()}
        return w - h["weight_decay"] * alpha * w - U, s


# -- recent optimizers: the papers' rules, with the authors' code's choices ------------------
class CautiousAdamW(Oracle):
    """Cautious AdamW (Liang et al. 2024, Algorithm "C-AdamW"; the authors' per-parameter
    code: transformers' AdamW, eps on the raw sqrt(v)): the Adam direction
    u = m/(sqrt(v)+eps) is kept only where u and g agree in sign, phi = [u*g > 0], and
    rescaled by the kept share, phi/max(mean(phi), MASK_FLOOR) over the whole tensor;
    w *= 1 - lr*wd first. ``pyopt=True``: pytorch-optimizer's cautious form instead
    (phi*n/(sum(phi)+1), the authors' first version, on torch's AdamW with eps added after
    the bias correction), to check this oracle against that package."""

    name = "cautious_adamw"
    array_states = {"m": 0.0, "v": 0.0}
    decoupled = True
    MASK_FLOOR = 1e-3
    pyopt = False

    def rule(self, w, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        w = w * (1 - h["lr"] * h["weight_decay"])
        m = b1 * s["m"] + (1 - b1) * g
        v = b2 * s["v"] + (1 - b2) * g * g
        c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if h["correct_bias"] else (1.0, 1.0)
        if self.pyopt:
            u = (m / c1) / (np.sqrt(v) / math.sqrt(c2) + h["eps"])
        else:
            u = (m / c1) * math.sqrt(c2) / (np.sqrt(v) + h["eps"])
        phi = (u * g > 0).astype(self.dtype)
        if self.pyopt:
            phi = phi * (phi.size / (phi.sum() + 1))
        elif phi.size:
            phi = phi / max(phi.mean(), self.MASK_FLOOR)
        self._flag_sign(m, b1 * s["m"], (1 - b1) * g)
        return w - h["lr"] * phi * u, {"m": m, "v": v}


class MARSAdamW(Oracle):
    """MARS-AdamW (Yuan et al. 2024, Algorithm 2, approximate form: the correction uses the
    previous step's gradient): c = g + gamma*b1/(1-b1)*(g - g_prev), c = c/||c|| when
    ||c|| > 1 (the whole tensor), Adam moments of c, w -= lr*(m_hat/(sqrt(v_hat)+eps) +
    wd*w). As the authors' code: only 2-D tensors unless optimize_1d; the others take
    AdamW of g with the *_1d betas, weight_decay_1d and lr*lr_1d_factor. ``pyopt=True``:
    pytorch-optimizer's MARS (tensors of ndim >= 2 take MARS; eps added before the
    bias correction, and 1e-15 inside the root)."""

    name = "mars_adamw"
    array_states = {"m": 0.0, "v": 0.0, "last_grad": 0.0}
    decoupled = True
    pyopt = False

    def rule(self, w, g, s, t):
        h = self.h
        mars = h["optimize_1d"] or (w.ndim >= 2 if self.pyopt else w.ndim == 2)
        if mars:
            b1, b2, lr, wd = h["beta1"], h["beta2"], h["lr"], h["weight_decay"]
            c = g + h["gamma"] * b1 / (1 - b1) * (g - s["last_grad"])
            n = norm(c)
            c = c / n if n > 1 else c
        else:
            b1, b2, wd = h["beta1_1d"], h["beta2_1d"], h["weight_decay_1d"]
            lr, c = h["lr"] * h["lr_1d_factor"], g
        m = b1 * s["m"] + (1 - b1) * c
        v = b2 * s["v"] + (1 - b2) * c * c
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        if self.pyopt:
            step = m_hat / ((np.sqrt(v + 1e-15) + h["eps"]) / math.sqrt(1 - b2 ** t))
        else:
            step = m_hat / (np.sqrt(v_hat) + h["eps"])
        return w - lr * (step + wd * w), {"m": m, "v": v, "last_grad": g}


class ScheduleFreeAdamW(Oracle):
    """Schedule-Free AdamW (Defazio et al. 2024, Algorithm 1, in its primal x/z form),
    with the authors' code's choices (schedulefree.AdamWScheduleFree): v bias-corrected
    inside the root, gamma_t = lr*min(1, t/warmup_steps), the average's weights
    t**r * lr_max**weight_lr_power (lr_max the largest gamma so far), weight decay at y:

        y = (1-b1) z + b1 x;  g at y;  v = b2 v + (1-b2) g^2
        z = z - gamma_t * (g / (sqrt(v/(1-b2^t)) + eps) + wd * y)
        c = weight_t / sum of weights;  x = (1-c) x + c z

    x and z start at w. ``w`` (compared with optgen's parameter) is y."""

    name = "schedule_free_adamw"
    array_states = {"z": 0.0, "exp_avg_sq": 0.0}
    scalar_states = {"k": 0.0, "lr_max": -1.0, "weight_sum": 0.0}
    decoupled = True

    def __init__(self, w0, **kw):
        super().__init__(w0, **kw)
        self.x = self.w.copy()
        self.s["z"] = self.w.copy()

    def scalar_rule(self, t):
        h, sc = self.h, self.sc
        sc["k"] += 1
        warm = h["warmup_steps"]
        self.gamma = h["lr"] * (min(1.0, sc["k"] / warm) if warm else 1.0)
        sc["lr_max"] = max(sc["lr_max"], self.gamma)
        weight = sc["k"] ** h["r"] * sc["lr_max"] ** h["weight_lr_power"]
        sc["weight_sum"] += weight
        self.c = weight / sc["weight_sum"] if sc["weight_sum"] else 0.0

    def rule(self, y, g, s, t):
        h = self.h
        b1, b2 = h["beta1"], h["beta2"]
        v = b2 * s["exp_avg_sq"] + (1 - b2) * g * g
        d = g / (np.sqrt(v / (1 - b2 ** self.sc["k"])) + h["eps"]) + h["weight_decay"] * y
        z = s["z"] - self.gamma * d
        self.x = (1 - self.c) * self.x + self.c * z
        return (1 - b1) * z + b1 * self.x, {"z": z, "exp_avg_sq": v}


ORACLES: dict[str, type] = {cls.name: cls for cls in (
    SGD, Momentum, NAG, Signum, Adam, LazyAdam, AdamWeightDecay, AdamW, Adamax, NAdam,
    RAdam, AdaBelief, AdaDelta, Lion, FTML, FTRL, RMSProp, ProximalAdagrad, Adagrad, LAMB,
    LARS, Adafactor, CautiousAdamW, MARSAdamW, ScheduleFreeAdamW)}

assert set(ORACLES) == set(DEFAULTS), set(ORACLES) ^ set(DEFAULTS)


def make_oracle(spec: str, w0, **hyper) -> Oracle:
    return ORACLES[spec](w0, **hyper)
