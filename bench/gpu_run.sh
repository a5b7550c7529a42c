#!/usr/bin/env bash
# The GPU issue's run, one prepared script for a lent machine (the device tool): set up,
# the CUDA tests, then the CUDA benchmark; everything lands in $OUT.
#
# The machine reaches no package registry, and apache-tvm's wheel is over the carry
# limit, so .gpu/ (git-ignored, carried) holds site.tar.xz (apache-tvm without its
# compiler library, apache-tvm-ffi, bitsandbytes with its CUDA 13.0 library alone,
# torchao) and libtvm_compiler.so.xz.* (xz -9e: 59 MB, split in parts when the whole is
# over the limit: a first call unpacks site.tar.xz into /tmp/site and keeps the first
# part; the second, on the still-warm machine, joins the parts into
# /tmp/site/tvm/lib/libtvm_compiler.so and runs this script). torch, CuPy, numpy,
# jinja2, pytest and xdist are the machine's own. Usage (from the repository root):
#     bash bench/gpu_run.sh [extra test files...]
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
if [ ! -s /tmp/site/tvm/lib/libtvm_compiler.so ]; then
    mkdir -p /tmp/site
    xz -dc .gpu/site.tar.xz | tar -xf - -C /tmp/site
    cat .gpu/libtvm_compiler.so.xz* | xz -dc > /tmp/site/tvm/lib/libtvm_compiler.so
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TVM_NUM_THREADS=4
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/pip.log" 2>&1 \
    || { stamp "pip install failed"; tail -20 "$OUT/pip.log"; exit 1; }
stamp "installed"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    nvcc --version | tail -2
    python3 -c "import torch, cupy, numpy, tvm; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'tvm', tvm.__version__)"
    python3 -c "import bitsandbytes, torchao; print('bitsandbytes', bitsandbytes.__version__, 'torchao', torchao.__version__)" 2>&1 | tail -1
    for s in thor muon; do timeout 60 python3 -m optgen.cli build specs/$s.py --target cuda 2>&1 | tail -1; done
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
stamp "prebuild"
timeout "${PREBUILD_TIMEOUT:-150}" python3 bench/gpu_prebuild.py 14 > "$OUT/prebuild.log" 2>&1
tail -30 "$OUT/prebuild.log"
stamp "tests"
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -n 14 -v -p no:cacheprovider -rfEs --durations=15 \
    tests/test_gpu_cuda.py tests/test_gpu_formats.py tests/test_state_formats_cuda.py \
    tests/test_multitensor.py tests/test_matrix_cuda.py tests/test_torch_interop.py "$@" \
    -k "cuda or gpu" > "$OUT/tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT/tests.log"
grep -E "passed|failed|rc=" "$OUT/tests.log" | tail -3
stamp "bench"
timeout "${BENCH_TIMEOUT:-150}" python3 bench/cuda_bench.py ${BENCH_ARGS:---bert --q8 --muon} --reps 20 \
    --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench.log"
cat "$OUT/bench.log"
stamp "done"
