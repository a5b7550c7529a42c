"""The parameters the benchmarks step: one flat fp32 set split into tensors, or BERT-base's
tensor list with Hugging Face's names and decay rule. Every contender copies them, so all
start from the same weights and gradients."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WD = 0.01     # the weight decay of the decayed workloads (BERT, LAMB)


@dataclass
class ParamSet:
    """The parameters of a workload: names (or None), fp32 weights and gradients, and
    which tensors take weight decay."""
    names: list[str] | None
    ws: list[np.ndarray]
    gs: list[np.ndarray]
    decay: list[bool]
    wd: float

    @property
    def n(self) -> int:
        return sum(w.size for w in self.ws)


def bert_base_shapes(layers: int = 12, vocab: int = 30522) -> list[tuple[str, tuple]]:
    """BERT-base's parameters with Hugging Face's names (bert-base-uncased: 199 tensors,
    109,482,240 parameters at 12 layers and the 30,522-token vocabulary)."""
    h, ff = 768, 3072
    out = [("embeddings.word_embeddings.weight", (vocab, h)),
           ("embeddings.position_embeddings.weight", (512, h)),
           ("embeddings.token_type_embeddings.weight", (2, h)),
           ("embeddings.LayerNorm.weight", (h,)), ("embeddings.LayerNorm.bias", (h,))]
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for q in ("query", "key", "value"):
            out += [(f"{p}attention.self.{q}.weight", (h, h)),
                    (f"{p}attention.self.{q}.bias", (h,))]
        out += [(f"{p}attention.output.dense.weight", (h, h)),
                (f"{p}attention.output.dense.bias", (h,)),
                (f"{p}attention.output.LayerNorm.weight", (h,)),
                (f"{p}attention.output.LayerNorm.bias", (h,)),
                (f"{p}intermediate.dense.weight", (ff, h)),
                (f"{p}intermediate.dense.bias", (ff,)),
                (f"{p}output.dense.weight", (h, ff)), (f"{p}output.dense.bias", (h,)),
                (f"{p}output.LayerNorm.weight", (h,)), (f"{p}output.LayerNorm.bias", (h,))]
    return out + [("pooler.dense.weight", (h, h)), ("pooler.dense.bias", (h,))]


def hf_decay(name: str) -> bool:
    """Hugging Face's trainer rule: no weight decay on biases and LayerNorm weights."""
    return not ("bias" in name or "LayerNorm" in name)


def grad(rng: np.random.Generator, shape) -> np.ndarray:
    """|g| in [0.1, 1): optgen's Adam eps convention (MXNet's) and torch's then agree."""
    g = rng.uniform(0.1, 1.0, shape).astype(np.float32)
    return np.where(rng.random(shape, dtype=np.float32) < 0.5, -g, g)


def flat_params(n: int, tensors: int = 1, wd: float = 0.0, seed: int = 0) -> ParamSet:
    """``n`` N(0, 1) parameters in ``tensors`` tensors of (nearly) equal size."""
    rng = np.random.default_rng(seed)
    sizes = [n // tensors + (i < n % tensors) for i in range(tensors)]
    ws = [rng.standard_normal(s, dtype=np.float32) for s in sizes]
    return ParamSet(None, ws, [grad(rng, s) for s in sizes], [wd > 0] * tensors, wd)


def bert_params(layers: int, vocab: int, seed: int = 0) -> ParamSet:
    """BERT's initialization: N(0, 0.02) matrices, LayerNorm weights 1, biases 0."""
    rng = np.random.default_rng(seed)
    names, ws, gs = [], [], []
    for name, shape in bert_base_shapes(layers, vocab):
        if name.endswith("bias"):
            w = np.zeros(shape, np.float32)
        elif "LayerNorm" in name:
            w = np.ones(shape, np.float32)
        else:
            w = 0.02 * rng.standard_normal(shape, dtype=np.float32)
        names.append(name)
        ws.append(w)
        gs.append(grad(rng, shape))
    return ParamSet(names, ws, gs, [hf_decay(n) for n in names], WD)


def concat(arrays) -> np.ndarray:
    """The arrays (numpy, torch on CPU, jax) as one flat numpy array."""
    return np.concatenate([np.asarray(a).ravel() for a in arrays])
