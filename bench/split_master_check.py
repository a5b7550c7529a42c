"""Every float32 bit pattern through the split master formats (optgen/core/formats/
split.py), in numpy, in chunks of 2^24:

* split16: decode(encode(θ)) is θ bit for bit for every non-NaN θ (NaN: a NaN of its
  sign); the weight is θ rounded to nearest, equal to ml_dtypes' round-to-nearest-even
  cast except at exact ties (where it is the neighbour away from zero);
* split8: |decode(encode(θ)) - θ| <= ULP(θ') / 254 for every finite θ whose bfloat16
  rounding θ' is finite; θ' is ml_dtypes' cast.

    python bench/split_master_check.py              (all 256 chunks)
    python bench/split_master_check.py --stride 8   (every 8th chunk, and the chunks of
                                                     zero, the subnormals, inf and NaN)
"""
from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

from optgen.core import formats
from optgen.core.formats.split import half_ulp

S16, S8 = formats.of("split16"), formats.of("split8")


def check(lo: int, n: int) -> tuple[int, int]:
    bits = np.arange(lo, lo + n, dtype=np.uint64).astype(np.uint32)
    theta = bits.view(np.float32)
    nan = np.isnan(theta)
    w, c = S16.family.encode(S16, theta)
    back = S16.family.decode(S16, w, c)
    assert np.array_equal(back.view(np.uint32)[~nan], bits[~nan]), "split16 not exact"
    assert np.isnan(back[nan]).all() and np.isnan(w.astype(np.float32)[nan]).all()
    with np.errstate(invalid="ignore"):       # (NaN payloads: ml_dtypes' quiet NaN)
        rne = theta.astype(ml_dtypes.bfloat16)
    ties = (bits & 0xFFFF) == 0x8000
    same = w.view(np.uint16) == rne.view(np.uint16)
    assert same[~ties & ~nan].all(), "split16 weight is not the nearest bfloat16"
    w8, c8 = S8.family.encode(S8, theta)
    assert np.array_equal(w8.view(np.uint16)[~nan], rne.view(np.uint16)[~nan])
    hi = w8.view(np.uint16).astype(np.uint32) << 16
    ok = np.isfinite(theta) & np.isfinite(w8.astype(np.float32))
    err = np.abs(S8.family.decode(S8, w8, c8)[ok].astype(np.float64) - theta[ok])
    bound = half_ulp(hi[ok]).astype(np.float64) / 127 * (1 + 2.0 ** -20)
    assert (err <= bound).all(), "split8 beyond ULP/254"
    return int(ties.sum()), int(ok.sum())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=1)
    args = ap.parse_args()
    t0, ties, finite = time.perf_counter(), 0, 0
    chunks = sorted(set(range(0, 256, args.stride)) | {0, 127, 128, 255})
    for k in chunks:
        a, b = check(k << 24, 1 << 24)
        ties, finite = ties + a, finite + b
    print(f"{len(chunks)} chunks of 2^24 patterns: split16 exact for every non-NaN "
          f"float32 ({ties} ties rounded away from zero); split8 within ULP/254 on "
          f"{finite} finite patterns; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
