"""Build Adam for this CPU and train a small least-squares model with it (numpy only).

    python examples/quickstart.py
"""
import time

import numpy as np

import optgen

rng = np.random.default_rng(0)
X = rng.standard_normal((512, 64)).astype(np.float32)
true_w = rng.standard_normal(64).astype(np.float32)
y = X @ true_w + 0.01 * rng.standard_normal(512).astype(np.float32)

w = np.zeros(64, np.float32)
b = np.zeros(1, np.float32)
start = time.perf_counter()
opt = optgen.create("adam", [w, b], lr=0.05)      # builds specs/adam.py once, then cached
print(f"adam kernels ready in {time.perf_counter() - start:.2f} s: {opt.artifact.path}")


def loss_and_grads():
    r = X @ w + b - y
    return float(np.mean(r * r)), [(2 / len(y)) * X.T @ r, np.array([2 * r.mean()], np.float32)]


first, _ = loss_and_grads()
for step in range(300):
    loss, grads = loss_and_grads()
    opt.step(grads)                               # one fused kernel call per parameter
    if step % 100 == 0:
        print(f"step {step:3d}  loss {loss:.5f}")
loss, _ = loss_and_grads()
print(f"step 300  loss {loss:.5f}  (from {first:.3f}); |w - w_true| = "
      f"{np.linalg.norm(w - true_w):.4f}")
assert loss < 0.01 * first, "Adam did not converge"
