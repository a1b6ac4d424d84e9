#!/bin/bash
# Session 12: bench_planner with measured per-op costs and the cheapest last step, for the models given.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  t=${T:-130}; [ "$m" = gpt_scanned ] && t=260
  timeout $t python benchmarks/bench_planner.py --only $m --out $OUT/planner_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/planner_$m.txt | grep -v "^$" | grep -v "^## verdicts" | grep -v "^model\|^---\|^program" | head -30
done
