#!/usr/bin/env bash
# One device call: versions, the test suite under the GPU machine's jax, then benchmarks.
#   TESTS="tests/..." (default: all but notebooks)  BENCHES="core partitioners ..."  BENCH_ARGS_<name>="..."
set -u
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# Test workers share one GPU: no preallocation, or the second worker runs out of memory.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import jax, sys; print(sys.version); print('jax', jax.__version__, jax.devices())"
if [ "${TESTS:-all}" != "none" ]; then
  python3 -m pytest ${TESTS:-tests --ignore=tests/test_notebooks.py} -q -n 8 -p no:cacheprovider 2>&1 \
    | tail -40 > "$OUT/tests_gpu.txt"; tail -15 "$OUT/tests_gpu.txt"
fi
for b in ${BENCHES:-core}; do
  var="BENCH_ARGS_$b"
  python3 benchmarks/bench_$b.py ${!var:-} --out "$OUT/${b}_gpu.txt" > "$OUT/${b}_log.txt" 2>&1
  tail -45 "$OUT/${b}_gpu.txt" 2>/dev/null || tail -20 "$OUT/${b}_log.txt"
done
