#!/bin/bash
# Session 11: goal 1 (never dominated) on one card for every zoo model, after the knapsack tie change.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
for m in "$@"; do
  timeout 200 python benchmarks/bench_planner.py --only $m --out $OUT/planner_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -A8 "^verdicts" $OUT/planner_$m.txt | grep -v "^$"
done
