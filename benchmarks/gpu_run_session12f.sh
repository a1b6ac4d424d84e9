#!/bin/bash
# Session 12: the scanned GPT under measured costs (probe and planner), then the fused-step, sliced-residual,
# scan-offload and op-cost tests on the GPU.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python benchmarks/probe_op_costs.py --only gpt_scanned --out $OUT/opcosts_gpt_scanned.txt > /tmp/log_p.txt 2>&1 || tail -5 /tmp/log_p.txt
grep "knapsack items" $OUT/opcosts_gpt_scanned.txt
timeout 260 python benchmarks/bench_planner.py --only gpt_scanned --out $OUT/planner_gpt_scanned.txt > /tmp/log_g.txt 2>&1 || tail -5 /tmp/log_g.txt
grep -v "^#" $OUT/planner_gpt_scanned.txt | grep -v "^$" | grep -v "^## verdicts" | grep -v "^model\|^---\|^program" | head -30
timeout 200 python -m pytest -q -n 8 -p no:cacheprovider tests/runtime/test_fused.py tests/runtime/test_residual_slices.py \
  tests/partition/test_scan_offload.py tests/partition/test_op_costs.py 2>&1 | tail -40 > $OUT/tests_gpu.txt; tail -12 $OUT/tests_gpu.txt
