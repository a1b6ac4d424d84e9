#!/usr/bin/env bash
# One device call: versions, the core tests under the GPU machine's jax, and the core benchmark.
set -u
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import jax, sys; print(sys.version); print('jax', jax.__version__, jax.devices())"
python3 -m pip list 2>/dev/null | grep -i -E "^(pytest|hypothesis|chex|flax|optax|equinox|pytest-xdist|scipy|nbclient|graphviz) " 
python3 -m pytest ${TESTS:-tests/test_tracing.py tests/test_autodiff.py tests/test_partitioners.py tests/test_runtime.py tests/test_eager.py} \
  -q -x -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/tests_gpu.txt"
for b in ${BENCHES:-core}; do
  python3 benchmarks/bench_$b.py --out "$OUT/${b}_gpu.txt" 2>&1 | tail -40
done
