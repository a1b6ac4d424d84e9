#!/bin/bash
# Planner re-measurement on the models where a JAX policy dominated (2026-11-23), after the kernel-output
# tie-break and with budgets matched to each policy's bytes. One model per process.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
for m in "$@"; do
  timeout 280 python benchmarks/bench_planner.py --only "$m" --out $OUT/planner_gpu_${D}_${m}.txt 2>&1 | grep -v "^W\|^I0" | grep -A40 "^## " | grep -v "^---" | tail -30
done
