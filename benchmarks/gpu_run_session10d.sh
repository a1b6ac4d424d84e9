#!/bin/bash
# Session 10: the measured copy overlap, then goal 3 with the planner using it.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
python benchmarks/probe_copy_overlap.py 2>&1 | tee $OUT/probe_copy_overlap.txt
for m in "$@"; do
  python benchmarks/bench_offload.py --rounds 7 --only $m --out $OUT/offload_gpu_$m.txt > $OUT/log_$m.txt 2>&1
  grep -A40 "verdicts (time" $OUT/offload_gpu_$m.txt | grep -v "^$" | head -24
done
