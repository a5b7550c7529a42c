"""Which part of q8 moves a model's loss? A torch model of AdamW with block-wise 8-bit
states ("fake quantization": each step decodes the stored states, steps in float32 with
the new, unrounded states, as the q8 kernels do, and rounds them back to their codes),
with the parts of the format as switches, for bench/q8_gpt2_bench.py's ``sim:`` rows.

A variant is a dot-separated list of switches (``sim:q8`` is every default):
  m-fp32 / v-fp32   keep that state in float32 (q8 on the other only)
  b<k>              k elements a block (default 256)
  rows              blocks never cross a row of a 2-D (or larger) parameter: each row is
                    cut into its own blocks (the last one of a row shorter)
  vdirect           code ``v`` itself with the unsigned map (q8's earlier form), not sqrt(v)
  sr                round codes stochastically (to a neighbouring map value, unbiased)
  lin               code sqrt(v) with a linear map of 255 steps above 0 (no decades)
A bench tool: the optimizers optgen builds are the compiled kernels, not this model.

    python bench/q8_variants.py      # how far q8's v drifts from float32's v (below)

Run as a script it measures the drift itself: blocks of 256 whose first half gets a
N(0, 1) gradient every step and whose second half gets one with a probability
log-spaced from 1 to 1e-3 (zero otherwise), Adam's ``v`` (beta2 0.999) kept in float32
and through q8's ``usqrt`` codes with nearest and with stochastic rounding, fed the same
gradients; it prints sqrt(v_q8 / v_fp32) by how often an element gets a gradient.
"""
from __future__ import annotations

import torch

from optgen.core import quant


def _map(kind: str) -> torch.Tensor:
    if kind == "lin":
        return torch.arange(256, dtype=torch.float32) / 255
    return torch.from_numpy(quant.dynamic_map(kind).copy())


class Coder:
    """Round trip of a state through block-wise codes (values in, decoded values out)."""

    def __init__(self, kind: str, block: int, rows: bool, sqrt: bool, sr: bool,
                 gen: torch.Generator):
        self.values = _map(kind)
        self.mids = (self.values[1:] + self.values[:-1]) / 2
        self.block, self.rows, self.sqrt, self.sr, self.gen = block, rows, sqrt, sr, gen

    def _blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        cols = x.shape[-1] if self.rows and x.dim() >= 2 else x.numel()
        lead = x.numel() // max(cols, 1)
        per = -(-cols // self.block) * self.block
        padded = torch.zeros(lead, per)
        padded[:, :cols] = x.reshape(lead, cols)
        return padded.reshape(-1, self.block), lead, cols

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = x.sqrt() if self.sqrt else x
        blocks, lead, cols = self._blocks(y)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        norm = torch.where(absmax > 0, blocks / absmax.clamp_min(1e-38), 0.0)
        if self.sr:
            lo = (torch.searchsorted(self.values, norm.contiguous(), right=True) - 1
                  ).clamp(0, self.values.numel() - 2)
            a, b = self.values[lo], self.values[lo + 1]
            p = ((norm - a) / (b - a)).clamp(0, 1)
            up = torch.rand(norm.shape, generator=self.gen) < p
            codes = lo + up.long()
        else:
            codes = torch.searchsorted(self.mids, norm.contiguous(), side="left")
        if self.sqrt:           # a positive value never codes as 0 (usqrt)
            zero = int(torch.searchsorted(self.values, torch.tensor(0.0)))
            codes = torch.where((codes == zero) & (norm > 0), codes + 1, codes)
        out = self.values[codes] * absmax
        out = out.reshape(lead, -1)[:, :cols].reshape(x.shape)
        return out * out if self.sqrt else out


class SimAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's rule (float32 weights) with the states coded by ``variant``."""

    def __init__(self, params, variant: str, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.01, seed: int = 0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        sw = set(variant.split(".")) - {"q8", ""}
        block = next((int(s[1:]) for s in sw if s[0] == "b" and s[1:].isdigit()), 256)
        gen = torch.Generator().manual_seed(seed)
        sr, rows = "sr" in sw, "rows" in sw
        self.m = None if "m-fp32" in sw else Coder("signed", block, rows, False, sr, gen)
        vkind = "lin" if "lin" in sw else "unsigned"
        self.v = None if "v-fp32" in sw else Coder(vkind, block, rows, "vdirect" not in sw,
                                                   sr, gen)
        unknown = sw - {"m-fp32", "v-fp32", "sr", "rows", "vdirect", "lin", f"b{block}"}
        if unknown:
            raise ValueError(f"unknown q8 variant switches {sorted(unknown)}")

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["t"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["t"] += 1
                t, grad = st["t"], p.grad.float()
                p.mul_(1 - g["lr"] * g["weight_decay"])
                m = st["m"].mul(b1).add_(grad, alpha=1 - b1)
                v = st["v"].mul(b2).addcmul_(grad, grad, value=1 - b2)
                denom = (v / (1 - b2 ** t)).sqrt_().add_(g["eps"])
                p.addcdiv_(m, denom, value=-g["lr"] / (1 - b1 ** t))
                st["m"] = self.m(m) if self.m else m
                st["v"] = self.v(v) if self.v else v
        return None


def drift(steps: int = 1500, blocks: int = 8, seed: int = 0) -> None:
    """Print sqrt(v_q8 / v_fp32) of elements by how often they get a gradient."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    p = torch.ones(blocks, 256)
    p[:, 128:] = torch.logspace(0, -3, 128)
    coders = {"nearest": Coder("unsigned", 256, False, True, False, gen),
              "stochastic": Coder("unsigned", 256, False, True, True, gen)}
    vf = torch.zeros(blocks, 256)
    vq = {k: torch.zeros(blocks, 256) for k in coders}
    for _ in range(steps):
        g = torch.randn(blocks, 256) * (torch.rand(blocks, 256) < p)
        vf = 0.999 * vf + 0.001 * g * g
        for k, c in coders.items():
            vq[k] = c((0.999 * vq[k] + 0.001 * g * g).reshape(-1)).reshape(blocks, 256)
    print(f"sqrt(v_q8 / v_fp32) after {steps} steps (mean, median, 90th percentile)")
    for k in coders:
        r = (vq[k] / vf.clamp_min(1e-30)).sqrt()
        for lo, hi in ((1, 1.01), (0.1, 1), (0.01, 0.1), (0.001, 0.01)):
            sel = (p >= lo) & (p < hi) & (vf > 0)
            print(f"  {k:<10} gradient probability [{lo}, {hi}): {r[sel].mean():.3f}  "
                  f"{r[sel].median():.3f}  {r[sel].quantile(0.9):.3f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    drift()

