#!/bin/bash
# Session 13: the fused step on the GPU zoo with order-free reductions derived again (bench_fused), one model per file;
# with --tests, the fused-step, rederive, ordering and sliced-residual tests on the GPU afterwards.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
tests=0
for m in "$@"; do
  if [ "$m" = "--tests" ]; then tests=1; continue; fi
  timeout 200 python benchmarks/bench_fused.py --only $m --out $OUT/fused_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/fused_$m.txt | grep -v "^$"
done
if [ $tests = 1 ]; then
  timeout 240 python -m pytest -q -n 8 -p no:cacheprovider tests/runtime/test_rederive.py tests/runtime/test_fused.py \
    tests/runtime/test_residual_slices.py 2>&1 | tail -30 > $OUT/tests_gpu.txt; tail -8 $OUT/tests_gpu.txt
fi
