#!/bin/bash
# Session 10: goal 3 with no-offload controls at the same budgets (what offloading costs). Arg: model substrings.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  python benchmarks/bench_offload.py --rounds 7 --only $m --out $OUT/offload_gpu_$m.txt > $OUT/log_$m.txt 2>&1
  grep -A40 "verdicts (time" $OUT/offload_gpu_$m.txt | grep -v "^$" | head -30
done
