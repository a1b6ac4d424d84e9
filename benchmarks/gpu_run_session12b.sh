#!/bin/bash
# Session 12: bench_planner with measured per-op costs (op_costs="auto" on the GPU) for the models given;
# PROBES (env) also get probe_op_costs first (all in one file: the device returns few files).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in $PROBES; do
  timeout 60 python benchmarks/probe_op_costs.py --only $m --out /tmp/opcosts_$m.txt > /tmp/log_p_$m.txt 2>&1 || tail -5 /tmp/log_p_$m.txt
  cat /tmp/opcosts_$m.txt >> $OUT/opcosts_more.txt
  grep "knapsack items" /tmp/opcosts_$m.txt
done
for m in "$@"; do
  timeout ${PLANNER_TIMEOUT:-150} python benchmarks/bench_planner.py --only $m --out $OUT/planner_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/planner_$m.txt | grep -v "^$" | grep -v "^## verdicts" | head -40
done
