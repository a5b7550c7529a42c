#!/usr/bin/env bash
# The GPU run, one prepared script for a lent GPU machine: set up from carried files,
# the CUDA tests, then the CUDA benchmark; logs and results land in $OUT.
#
# The machine reaches no package registry and needs no compiler: every CUDA artifact
# the tests and the benchmark load is built beforehand on a CPU machine with nvcc, and
# travels in .gpu/ (git-ignored; carry it):
#     OPTGEN_CACHE_DIR=/tmp/gpucache python bench/gpu_prebuild.py --pack .gpu/cache.tar.xz
#     .gpu/site.tar.xz: apache-tvm without its compiler library (its runtime and its
#         version for the cache key), apache-tvm-ffi for the machine's Python, torchao,
#         bitsandbytes with its CUDA 13.0 library alone (docs/targets.md says how)
# torch, CuPy, numpy, jinja2, pytest and xdist are the machine's own. A test that would
# build a kernel there skips, naming TVM's missing compiler (CI runs it).
# Usage, from the repository root:   bash bench/gpu_run.sh [extra pytest arguments...]
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
export OPTGEN_CACHE_DIR=${OPTGEN_CACHE_DIR:-/tmp/optgen-gpu-cache}
mkdir -p /tmp/site "$OPTGEN_CACHE_DIR"
xz -dc .gpu/site.tar.xz | tar -xf - -C /tmp/site || { stamp "no .gpu/site.tar.xz"; exit 1; }
xz -dc .gpu/cache.tar.xz | tar -xf - -C "$OPTGEN_CACHE_DIR" || { stamp "no .gpu/cache.tar.xz"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TVM_NUM_THREADS=4
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/pip.log" 2>&1 \
    || { stamp "pip install failed"; tail -20 "$OUT/pip.log"; exit 1; }
stamp "installed; $(ls "$OPTGEN_CACHE_DIR" | wc -l) prebuilt artifacts"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
    nvcc --version | tail -2
    python3 --version
    python3 -c "import torch, cupy, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
    python3 -c "import importlib.metadata as m; print(*(f'{p} {m.version(p)}' for p in ('apache-tvm', 'apache-tvm-ffi', 'bitsandbytes', 'torchao')))"
    python3 -c "import optgen; a = optgen.get_artifact('adam', 'cuda', build=False); print('prebuilt cache hit:', a.path)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
stamp "tests"
timeout "${TEST_TIMEOUT:-270}" python3 -m pytest -n "${WORKERS:-14}" -v -p no:cacheprovider -rfEs \
    --durations=15 tests/test_gpu_cuda.py tests/test_gpu_formats.py \
    tests/test_state_formats_cuda.py tests/test_multitensor.py tests/test_matrix_cuda.py \
    tests/test_torch_interop.py -k "cuda or gpu" "$@" > "$OUT/tests.log" 2>&1
echo "pytest rc=$?" >> "$OUT/tests.log"
{
    grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-400 | head -40
    echo "skipped because a kernel would be built here: $(grep -c 'builds a kernel' "$OUT/tests.log")"
    grep -E "passed|failed|rc=" "$OUT/tests.log" | tail -2
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
stamp "bench"
timeout "${BENCH_TIMEOUT:-170}" python3 bench/cuda_bench.py ${BENCH_ARGS:---bert --q8 --muon} \
    --reps "${REPS:-20}" --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench.log"
cat "$OUT/bench.log"
stamp "done"
