"""q8 as it stored non-negative states before the square-root map, for benches that put
the two forms side by side (bench/q8_gpt2_bench.py, bench/q8_step_bench.py).

q8 now codes a state the compiler proves non-negative (Adam's ``v``) as the unsigned
dynamic map's code of ``sqrt(v)`` ("q8:usqrt"); before, it coded ``v`` itself
("q8:unsigned"). ``legacy_q8(folder)`` builds q8 kernels of the earlier form: inside
it the q8 family picks the unsigned map for non-negative states, and artifacts build
into ``folder`` (the artifact key hashes the sources, not this switch, so the two forms
must not share a cache folder). Optimizers created inside keep their kernels after it
ends; compile their variants inside (one step) before leaving it. A bench tool, not an
option: the runtime never builds the earlier form.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator

from optgen.core.formats import blocked


@contextlib.contextmanager
def legacy_q8(folder: str) -> Iterator[None]:
    family = blocked.BLOCKED
    members = dict(type(family).members)
    members["q8"] = dataclasses.replace(members["q8"], nonneg="unsigned")
    before = os.environ.get("OPTGEN_CACHE_DIR")
    family.members = members          # (an instance attribute over the class's)
    os.environ["OPTGEN_CACHE_DIR"] = folder
    try:
        yield
    finally:
        del family.members
        if before is None:
            os.environ.pop("OPTGEN_CACHE_DIR", None)
        else:
            os.environ["OPTGEN_CACHE_DIR"] = before
