"""THOR's statistics for the torch drop-ins, from hooks on a model's ``nn.Linear`` layers
(re-exported as ``optgen.torch.KFACStatistics``; docs/matrix.md)."""
from __future__ import annotations

import torch


class KFACStatistics:
    """THOR's statistics from forward and backward hooks on ``nn.Linear`` layers.

        stats = optgen.torch.KFACStatistics(model)
        for x, y in batches:
            stats.record = opt.refresh_due        # hooks compute only when needed
            loss_fn(model(x), y).backward()
            opt.step(**stats.collect(opt))

    For each layer's weight (out x in): ``A`` = the sum over the batch of a a^T (a: the
    layer's input rows, leading dimensions flattened) and ``G`` = the sum of d d^T (d: the
    gradient of the loss with respect to the layer's output rows), divided by the squared
    ``loss_scale`` when the loss was scaled. With a mean loss this is the spec's
    convention (specs/thor.py normalizes by batch_size). ``collect`` returns them in the
    optimizer's parameter order (None for every other parameter) and forgets them."""

    def __init__(self, model: torch.nn.Module, loss_scale: float = 1.0):
        self.record = True
        self.loss_scale = float(loss_scale)
        self._found: dict[int, dict[str, torch.Tensor]] = {}
        self._handles = []
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                self._handles.append(module.register_forward_hook(self._forward))

    def _forward(self, module, inputs, output) -> None:
        """A from the input; G from the output's gradient, through a hook on the output
        tensor (a module backward hook would also need the input to require grad)."""
        if not self.record:
            return
        found = self._found.setdefault(id(module.weight), {})
        with torch.no_grad():
            a = inputs[0].detach().reshape(-1, module.in_features)
            found["A"] = a.T @ a
        if output.requires_grad:
            def backward(grad: torch.Tensor) -> None:
                with torch.no_grad():
                    d = grad.detach().reshape(-1, module.out_features)
                    found["G"] = (d.T @ d) / (self.loss_scale * self.loss_scale)
            output.register_hook(backward)

    def collect(self, optimizer) -> dict[str, list]:
        """``{"A": [...], "G": [...]}`` aligned with ``optimizer``'s parameters; empty
        when nothing was recorded (steps that do not refresh)."""
        found, self._found = self._found, {}
        if not found:
            return {}
        params = optimizer._params
        return {name: [found.get(id(p), {}).get(name) for p in params] for name in ("A", "G")}

    def remove(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
