#!/bin/bash
# Session 12: measured costs less an empty kernel's time: the MoE probe, then bench_planner for the models given.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python benchmarks/probe_op_costs.py --only moe_top2 --out $OUT/opcosts_moe_top2.txt > /tmp/log_p.txt 2>&1 || tail -5 /tmp/log_p.txt
grep -v "^#" $OUT/opcosts_moe_top2.txt | head -22
for m in "$@"; do
  timeout ${T:-120} python benchmarks/bench_planner.py --only $m --out $OUT/planner_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/planner_$m.txt | grep -v "^$" | grep -v "^## verdicts" | grep -v "^model\|^---\|^program" | head -30
done
