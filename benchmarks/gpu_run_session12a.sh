#!/bin/bash
# Session 12: measured per-op costs against FLOP counts in the knapsack (probe_op_costs), per zoo model.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 100 python benchmarks/probe_op_costs.py --only $m --out $OUT/opcosts_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/opcosts_$m.txt | grep -v "^$" | head -45
done
