"""Oracles of the elementwise families (specs/adopt.py, ademamix.py, ...), written from
the papers' algorithms in their own notation, in float64 numpy: ``ORACLES[name](w,
grads, **hypers)`` returns the parameter after ``len(grads)`` steps. Not derived from the
specs; where a paper leaves a detail out (a first step, a bias correction), the authors'
code decides it, and the docstring says so."""
from __future__ import annotations

import math

import numpy as np


def adopt(w, grads, lr=1e-3, beta1=0.9, beta2=0.9999, eps=1e-6, weight_decay=0.0,
          decouple=False, clip_power=0.25):
    """Taniguchi et al. 2024, Algorithm 2 (ADOPT with clipping): v_0 = g_0^2; then
    m_t = b1 m + (1 - b1) clip(g_t / max(sqrt(v_{t-1}), eps), c_t), w -= lr m_t,
    v_t = b2 v + (1 - b2) g_t^2; c_t = t**0.25 with t counted from 1 (the authors' code)."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), None
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        if decouple:
            w = w * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * w
        if v is None:
            v = g * g
            continue
        n = g / np.maximum(np.sqrt(v), eps)
        if clip_power is not None:
            n = np.clip(n, -t ** clip_power, t ** clip_power)
        m = beta1 * m + (1 - beta1) * n
        w = w - lr * m
        v = beta2 * v + (1 - beta2) * g * g
    return w


def ademamix(w, grads, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=2.0, t_alpha=None,
             t_beta3=None, eps=1e-8, weight_decay=0.0):
    """Pagliardini et al. 2024, Algorithm 1 with the schedulers of its section 3:
    alpha(t) = min(t alpha / T_alpha, alpha), beta3(t) = min(exp(ln b1 ln b3 /
    ((1 - t/T) ln b3 + t/T ln b1)), b3); decoupled weight decay."""
    b1, b2, b3 = betas
    w = w.astype(np.float64)
    m1, m2, nu = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        a = alpha if t_alpha is None else min(t * alpha / t_alpha, alpha)
        b = b3
        if t_beta3 is not None:
            f = t / t_beta3
            b = min(math.exp(math.log(b1) * math.log(b3) /
                             ((1 - f) * math.log(b3) + f * math.log(b1))), b3)
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b * m2 + (1 - b) * g
        nu = b2 * nu + (1 - b2) * g * g
        m1h, nuh = m1 / (1 - b1 ** t), nu / (1 - b2 ** t)
        w = w - lr * ((m1h + a * m2) / (np.sqrt(nuh) + eps) + weight_decay * w)
    return w


def laprop(w, grads, lr=4e-4, beta1=0.9, beta2=0.999, eps=1e-15):
    """Ziyin et al. 2020, Algorithm 1 (constant lr): n_t = b2 n + (1 - b2) g^2,
    m_t = b1 m + (1 - b1) g / (sqrt(n_t / c_n) + eps), w -= lr m_t / c_m with
    c_n = 1 - b2^t, c_m = 1 - b1^t."""
    w = w.astype(np.float64)
    m, n = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        n = beta2 * n + (1 - beta2) * g * g
        m = beta1 * m + (1 - beta1) * g / (np.sqrt(n / (1 - beta2 ** t)) + eps)
        w = w - lr * m / (1 - beta1 ** t)
    return w


def yogi(w, grads, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-3, initial_accumulator=1e-6):
    """Zaheer et al. 2018, Algorithm 2, with Adam's bias correction (which the paper
    omits "for clarity"): v_t = v - (1 - b2) sign(v - g^2) g^2."""
    w = w.astype(np.float64)
    m = np.full_like(w, initial_accumulator)
    v = np.full_like(w, initial_accumulator)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = v - (1 - beta2) * np.sign(v - g * g) * g * g
        w = w - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    return w


def adabound(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, final_lr=0.1, gamma=1e-3, eps=1e-8,
             amsbound=False):
    """Luo et al. 2019, Algorithm 2 (AdaBound; AMSBound with the running maximum) with
    the authors' code's bounds final_lr (1 -+ 1/(gamma t (+1))) and bias corrections."""
    w = w.astype(np.float64)
    m, v, vmax = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        vmax = np.maximum(vmax, v)
        eta = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) / (
            np.sqrt(vmax if amsbound else v) + eps)
        eta = np.clip(eta, final_lr * (1 - 1 / (gamma * t + 1)), final_lr * (1 + 1 / (gamma * t)))
        w = w - eta * m
    return w


def qhadam(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, nus=(1.0, 1.0), eps=1e-8):
    """Ma & Yarats 2019, Algorithm (QHAdam): Adam's bias-corrected moments, the step
    ((1 - nu1) g + nu1 m_hat) / (sqrt((1 - nu2) g^2 + nu2 v_hat) + eps)."""
    nu1, nu2 = nus
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        mh, vh = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        w = w - lr * ((1 - nu1) * g + nu1 * mh) / (np.sqrt((1 - nu2) * g * g + nu2 * vh) + eps)
    return w


def qhm(w, grads, lr=1e-3, momentum=0.999, nu=0.7):
    """Ma & Yarats 2019, equation (QHM): g_buf = b g_buf + (1 - b) g,
    w -= lr ((1 - nu) g + nu g_buf)."""
    w = w.astype(np.float64)
    buf = np.zeros_like(w)
    for g in grads:
        buf = momentum * buf + (1 - momentum) * g
        w = w - lr * ((1 - nu) * g + nu * buf)
    return w


def adamod(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, beta3=0.999, eps=1e-8):
    """Ding et al. 2019, Algorithm 1: eta_t = lr_t / (sqrt(v_hat) + eps) with Adam's
    corrections folded into lr_t, s_t = b3 s + (1 - b3) eta_t, w -= min(eta_t, s_t) m."""
    w = w.astype(np.float64)
    m, v, s = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        eta = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) / (np.sqrt(v) + eps)
        s = beta3 * s + (1 - beta3) * eta
        w = w - np.minimum(eta, s) * m
    return w


def diffgrad(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
    """Dubey et al. 2020, Algorithm 1: the friction xi = sigmoid(|g_{t-1} - g_t|)
    (g_0 = 0) multiplies Adam's first moment."""
    w = w.astype(np.float64)
    m, v, prev = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        xi = 1 / (1 + np.exp(-np.abs(prev - g)))
        w = w - lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * xi * m / (np.sqrt(v) + eps)
        prev = g
    return w


def sgdw(w, grads, lr=1e-4, momentum=0.0, weight_decay=0.0, nesterov=False):
    """Loshchilov & Hutter 2019, Algorithm 1 (SGDW) with torch's momentum buffer (the
    first buffer is g): w = w (1 - lr wd) - lr d."""
    w = w.astype(np.float64)
    buf = None
    for g in grads:
        buf = g.astype(np.float64) if buf is None else momentum * buf + g
        d = g + momentum * buf if nesterov else buf
        w = w * (1 - lr * weight_decay) - lr * d
    return w


def padam(w, grads, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, partial=0.25, amsgrad=True):
    """Chen et al. 2020, Algorithm 1 (Padam): w -= lr m / v_hat^p with v_hat the running
    maximum of v; bias corrections and eps as in the authors' code."""
    w = w.astype(np.float64)
    m, v, vmax = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        vmax = np.maximum(vmax, v)
        denom = (np.sqrt(vmax if amsgrad else v) + eps) ** (2 * partial)
        w = w - lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * m / denom
    return w


def grams(w, grads, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
    """Cao et al. 2024, Algorithm 1: u = m_hat / (sqrt(v_hat) + eps),
    w = w - lr (sign(g) |u| + wd w)."""
    w = w.astype(np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        u = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
        w = w - lr * (np.sign(g) * np.abs(u) + weight_decay * w)
    return w


ORACLES = {f.__name__: f for f in (adopt, ademamix, laprop, yogi, adabound, qhadam, qhm,
                                   adamod, diffgrad, sgdw, padam, grams)}
