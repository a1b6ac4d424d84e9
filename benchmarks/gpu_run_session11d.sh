#!/bin/bash
# Session 11: sliced residuals (the fused QKV output) through the barrier, whole or as slices.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
for m in "$@"; do
  timeout 200 python benchmarks/probe_residual_slices.py $m --rounds 9 --out $OUT/slices_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/slices_$m.txt | grep -v "^$"
done
