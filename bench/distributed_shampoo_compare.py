"""optgen.torch.Shampoo next to Distributed Shampoo itself, from the same start on the same data.

    python bench/distributed_shampoo_compare.py /path/to/facebookresearch/optimizers

Distributed Shampoo (facebookresearch/optimizers, distributed_shampoo/) is not a pip
package: pass the path of a checkout; its package is put on sys.path. Each optimizer
trains its own copy of a tanh MLP (float32) on the same batches for ``--steps`` steps;
the script prints the largest weight difference relative to the largest weight, for
Distributed Shampoo with float32 factors (its default) and with float64 factors, and for
optgen against tests/distributed_shampoo_oracle.py (float64). docs/matrix.md, "Shampoo
and Distributed Shampoo", records a run.

The configuration (the one tests/test_shampoo_vs_distributed.py checks): Adam grafting,
root inverses by eigendecomposition (DefaultShampooConfig), EMA factors with bias
correction, decoupled weight decay, whole-matrix blocks (target_parameter_dimensionality
2), the biases preconditioned as vectors; optgen with fresh_roots and precondition_1d.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(args) -> tuple[dict, dict]:
    ds = dict(lr=args.lr, betas=(0.9, args.shampoo_beta2), epsilon=args.epsilon,
              weight_decay=0.01, max_preconditioner_dim=1024, precondition_frequency=args.f,
              start_preconditioning_step=args.start, use_bias_correction=True)
    og = dict(lr=args.lr, beta1=0.9, beta2=0.999, eps=1e-8, shampoo_beta2=args.shampoo_beta2,
              epsilon=args.epsilon, root=4.0, weight_decay=0.01, precondition_frequency=args.f,
              start_preconditioning_step=args.start, fresh_roots=True, precondition_1d=True)
    return ds, og


def model(sizes: list[int], dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [torch.nn.Linear(a, b, bias=i < len(sizes) - 2), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1]).to(dtype)


def batches(sizes: list[int], steps: int, batch: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, sizes[0], generator=g),
             torch.randint(0, sizes[-1], (batch,), generator=g)) for _ in range(steps)]


def train(net, step, data) -> list[np.ndarray]:
    dtype = next(net.parameters()).dtype
    for x, y in data:
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(x.to(dtype)), y).backward()
        step(net)
    return [p.detach().double().numpy().copy() for p in net.parameters()]


def distributed(checkout: str, ds: dict, factor_dtype, sizes, data) -> list[np.ndarray]:
    sys.path.insert(0, os.path.abspath(checkout))
    from distributed_shampoo import (AdamPreconditionerConfig, DistributedShampoo,
                                     RootInvShampooPreconditionerConfig,
                                     SingleDeviceDistributedConfig)
    net = model(sizes)
    opt = DistributedShampoo(
        net.parameters(), **ds, grafting_config=AdamPreconditionerConfig(beta2=0.999,
                                                                          epsilon=1e-8),
        distributed_config=SingleDeviceDistributedConfig(target_parameter_dimensionality=2),
        preconditioner_config=RootInvShampooPreconditionerConfig(
            factor_matrix_dtype=factor_dtype, inv_factor_matrix_dtype=factor_dtype))
    return train(net, lambda _: opt.step(), data)


def oracle(ds: dict, sizes, data) -> list[np.ndarray]:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from distributed_shampoo_oracle import DistributedShampooOracle
    net = model(sizes, torch.float64)
    o = DistributedShampooOracle([p.detach().numpy() for p in net.parameters()], **ds,
                                 target_parameter_dimensionality=2,
                                 grafting=dict(beta2=0.999, epsilon=1e-8))

    def step(net):
        o.step([p.grad.numpy() for p in net.parameters()])
        with torch.no_grad():
            for p, w in zip(net.parameters(), o.w):
                p.copy_(torch.from_numpy(w))
    return train(net, step, data)


def optgen_run(og: dict, sizes, data) -> list[np.ndarray]:
    import optgen.torch as otorch
    net = model(sizes)
    opt = otorch.Shampoo(net.parameters(), **og)
    return train(net, lambda _: opt.step(), data)


def off(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b)) / \
        max(float(np.abs(x).max()) for x in b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="a checkout of facebookresearch/optimizers")
    ap.add_argument("--sizes", default="6,10,4", help="layer widths (the test's MLP)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--f", type=int, default=5, help="precondition_frequency")
    ap.add_argument("--start", type=int, default=10, help="start_preconditioning_step")
    ap.add_argument("--shampoo-beta2", type=float, default=0.95)
    ap.add_argument("--epsilon", type=float, default=1e-6)
    args = ap.parse_args()
    logging.disable(logging.WARNING)           # Distributed Shampoo logs every block
    sizes = [int(s) for s in args.sizes.split(",")]
    data = batches(sizes, args.steps, args.batch)
    ds, og = config(args)
    w0 = [p.detach().double().numpy() for p in model(sizes).parameters()]
    runs = {"Distributed Shampoo, float32 factors": distributed(args.checkout, ds,
                                                                  torch.float32, sizes, data),
            "Distributed Shampoo, float64 factors": distributed(args.checkout, ds,
                                                                  torch.float64, sizes, data),
            "oracle (tests/distributed_shampoo_oracle.py, float64)": oracle(ds, sizes, data)}
    mine = optgen_run(og, sizes, data)
    print(f"MLP {args.sizes}, {args.steps} steps, batch {args.batch}, f {args.f}, start "
          f"{args.start}, shampoo_beta2 {args.shampoo_beta2}, epsilon {args.epsilon}")
    print(f"weights moved (relative to max|w|): {off(w0, mine):.3g}")
    for name, w in runs.items():
        print(f"optgen vs {name}: max|dw| / max|w| = {off(mine, w):.3g}")
    base = runs["oracle (tests/distributed_shampoo_oracle.py, float64)"]
    for name, w in list(runs.items())[:2]:
        print(f"oracle vs {name}: {off(w, base):.3g}")
    print("Distributed Shampoo, float32 vs float64 factors: "
          f"{off(*list(runs.values())[:2]):.3g}")


if __name__ == "__main__":
    main()
