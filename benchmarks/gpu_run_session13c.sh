#!/bin/bash
# Session 13: goal 3 re-measured with the final code (measured op costs since session 12). Arg: model substrings.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 290 python benchmarks/bench_offload.py --rounds 7 --only $m --out $OUT/offload_gpu_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -A40 "verdicts (time" $OUT/offload_gpu_$m.txt | grep -v "^$" | head -24
done
