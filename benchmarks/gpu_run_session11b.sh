#!/bin/bash
# Session 11: the fused step with the barrier choice (choose_barrier), every zoo model, one model per process.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
for m in "$@"; do
  timeout 250 python benchmarks/bench_fused.py --rounds 9 --only $m --out $OUT/fused_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/fused_$m.txt | grep -v "^$"
done
