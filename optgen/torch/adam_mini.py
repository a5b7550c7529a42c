"""Adam-mini with its authors' signature and defaults (pip adam-mini 1.1.1, class
``Adam_mini``), stepped by the ``adam_mini`` spec (specs/adam_mini.py):

    opt = optgen.torch.AdamMini(model.named_parameters(), lr=1e-3, weight_decay=0.1,
                                dim=768, n_heads=12, n_kv_heads=4)

Like the authors' class it takes ``named_parameters`` and makes one parameter group per
parameter (skipping those without ``requires_grad``), and picks each one's blocks from
its lower-cased name, in the authors' order: "bias" -> Adam (a second moment per
element); a query/key name (``WQK_NAMES``) -> one block per head, the 2-D weight's
rows in groups of ``dim * dim / n_heads`` elements (``heads = numel * n_heads /
dim**2``, so a grouped-query key weight gets n_kv_heads); an embedding, output, value,
attention-projection or MLP name -> one block per output neuron (row); anything else
(norms) -> one block per tensor. Names with "norm", "ln" or "bias" get no weight decay.
Differences from the authors' class: it is refused (ValueError) where theirs would
fail or straddle rows (a query/key weight whose head blocks are not whole rows, a
per-neuron parameter that is not 2-D); the name sets are fixed at construction; the
block second moment is stored per row (``state["vmean"]``, equal within a block);
``verbose`` prints nothing and ``model_sharding`` is ignored, as theirs now does.
Imports: drop_in.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from .drop_in import OptgenOptimizer
from optgen.runtime import catalog

EMBD_NAMES = ("embed", "embd", "wte")
OUTPUT_NAMES = ("lm_head", "output", "final_layer")
WQK_NAMES = ("k_proj", "q_proj", "wq", "wk", "query", "key")
WV_NAMES = ("v_proj", "wv", "value")
ATTN_PROJ_NAMES = ("o_proj", "wo", "attn.proj")
MLP_NAMES = ("feed_forward", "linear", "mlp")
NEURON_NAMES = EMBD_NAMES + OUTPUT_NAMES + WV_NAMES + MLP_NAMES + ATTN_PROJ_NAMES


def block(name: str) -> str:
    """"adam", "head", "neuron" or "tensor": the blocks of a parameter by its name."""
    name = name.lower()
    if "bias" in name:
        return "adam"
    if any(x in name for x in WQK_NAMES):
        return "head"
    return "neuron" if any(x in name for x in NEURON_NAMES) else "tensor"


def _heads(name: str, shape: tuple[int, ...], dim: int, n_heads: int) -> int:
    kind = block(name)
    if kind == "head":
        head_numel = dim * dim // n_heads
        n = math.prod(shape) // head_numel if head_numel else 0
        if len(shape) != 2 or n < 1 or n * head_numel != math.prod(shape) or shape[0] % n:
            raise ValueError(f"AdamMini: parameter {name!r} (shape {shape}) is a query/key "
                             f"weight, but its {math.prod(shape)} elements do not split into "
                             f"whole-row heads of dim * dim / n_heads = {head_numel} elements "
                             f"(dim={dim}, n_heads={n_heads})")
        return n
    if kind == "neuron":
        if len(shape) != 2:
            raise ValueError(f"AdamMini: parameter {name!r} (shape {shape}) has one block "
                             "per output neuron (by its name), which needs a 2-D weight")
        return shape[0]
    return 1


class AdamMini(OptgenOptimizer):
    """Adam-mini (Zhang et al. 2024) as the authors' Adam_mini steps it (see the module)."""

    spec_name = "adam_mini"

    def __init__(self, named_parameters: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, *, model_sharding: bool | None = None,
                 dim: int = 2048, n_heads: int = 32, n_kv_heads: int | None = None,
                 verbose: bool = True, **options: Any) -> None:
        for what, value in (("dim", dim), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"AdamMini: {what} must be an int >= 1, got {value!r}")
        if n_kv_heads is not None and n_heads % n_kv_heads:
            raise ValueError(f"AdamMini: n_kv_heads={n_kv_heads} must divide "
                             f"n_heads={n_heads}")
        if isinstance(weight_decay, (int, float)) and weight_decay < 0:
            raise ValueError(f"AdamMini: weight_decay must be >= 0, got {weight_decay!r}")
        self.dim, self.n_heads = dim, n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        groups = []
        for pair in named_parameters:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
                raise TypeError("AdamMini: named_parameters must give (name, parameter) "
                                f"pairs (model.named_parameters()), got {type(pair).__name__}")
            name, p = pair
            if not p.requires_grad:
                continue
            low = name.lower()
            decay = 0.0 if "norm" in low or "ln" in low or "bias" in low else weight_decay
            groups.append({"params": [(name, p)], "weight_decay": decay,
                           "heads": _heads(name, tuple(p.shape), dim, n_heads)})
        self.spec = catalog.resolve(self.spec_name)
        options.setdefault("betas", betas)
        super().__init__(groups, lr=lr, eps=eps, weight_decay=weight_decay, **options)


AdamMini.__module__ = "optgen.torch"
