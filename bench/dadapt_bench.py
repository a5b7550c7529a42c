"""optgen.torch.DAdaptAdam beside the authors' dadaptation.DAdaptAdam (pip package
``dadaptation``) and torch.optim.Adam (an anchor: a plain Adam step of the same
tensors), float32 on the CPU: the median time of one optimizer step over the same
parameters and gradients, the three stepped in turn in one process.

    python bench/dadapt_bench.py                  # 2 transformer-MLP-like blocks: 12 tensors, 9.4M values
    python bench/dadapt_bench.py --width 256 --layers 2 --repeats 50

Each ``step()`` of both D-Adaptation classes computes the two sums over all parameters
and the update; optgen's runs a first kernel pass per tensor (the sums' parts), adds them
on the host and runs the update pass.
"""
from __future__ import annotations

import os
import sys

import torch

import optgen.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clip_bench import arguments, interleaved, model_params, report  # noqa: E402


def main() -> None:
    args = arguments(__doc__)
    import dadaptation
    rows = {
        "optgen.torch.DAdaptAdam": lambda ps: optgen.torch.DAdaptAdam(ps),
        "dadaptation.DAdaptAdam (authors)": lambda ps: dadaptation.DAdaptAdam(ps),
        "torch.optim.Adam (anchor, foreach)": lambda ps: torch.optim.Adam(ps, foreach=True),
    }
    params = {name: model_params(args.width, args.layers, 1e-2) for name in rows}
    times = interleaved({name: make(params[name]) for name, make in rows.items()},
                        args.rounds, args.repeats)
    report(params["optgen.torch.DAdaptAdam"], times, "dadaptation.DAdaptAdam (authors)")


if __name__ == "__main__":
    main()
