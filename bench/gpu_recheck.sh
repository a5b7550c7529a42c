#!/usr/bin/env bash
# A short second GPU call after bench/gpu_run.sh (same carried .gpu/): one test under
# compute-sanitizer's memcheck, the given tests, then the given benchmark rows.
#     SANITIZE="tests/x.py -k name" TESTS="-k expr" BENCH_ARGS="--muon" bash bench/gpu_recheck.sh
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export OPTGEN_CACHE_DIR=${OPTGEN_CACHE_DIR:-/tmp/optgen-gpu-cache} PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/tvm ]; then
    mkdir -p /tmp/site "$OPTGEN_CACHE_DIR"
    xz -dc .gpu/site.tar.xz | tar -xf - -C /tmp/site
    xz -dc .gpu/cache.tar.xz | tar -xf - -C "$OPTGEN_CACHE_DIR"
    python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/pip.log" 2>&1
fi
if [ -n "${SANITIZE:-}" ]; then
    timeout "${SANITIZE_TIMEOUT:-60}" compute-sanitizer --tool memcheck --print-limit 20 \
        python3 -m pytest -x -q -p no:cacheprovider $SANITIZE > "$OUT/sanitize.log" 2>&1
    echo "sanitize rc=$?" >> "$OUT/sanitize.log"; tail -40 "$OUT/sanitize.log" | cut -c1-300
fi
if [ -n "${TESTS:-}" ]; then
    timeout "${TEST_TIMEOUT:-90}" python3 -m pytest -n "${WORKERS:-14}" -v -p no:cacheprovider -rfEs \
        tests/test_gpu_cuda.py tests/test_gpu_formats.py tests/test_matrix_cuda.py -k "$TESTS" \
        > "$OUT/tests.log" 2>&1
    echo "pytest rc=$?" >> "$OUT/tests.log"
    grep -E "^(FAILED|ERROR)|passed|failed|rc=" "$OUT/tests.log" | cut -c1-300 | tail -30
fi
if [ -n "${BENCH_ARGS:-}" ]; then
    timeout "${BENCH_TIMEOUT:-40}" python3 bench/cuda_bench.py $BENCH_ARGS --json "$OUT/bench.json" \
        > "$OUT/bench.log" 2>&1
    echo "bench rc=$?" >> "$OUT/bench.log"; cat "$OUT/bench.log"
fi
