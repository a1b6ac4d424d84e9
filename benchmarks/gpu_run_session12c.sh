#!/bin/bash
# Session 12: MoE planner with FLOP costs (the same card as the measured run), ConvNet and scanned GPT with
# measured costs, and the scanned GPT's op-cost probe.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
run() { tag=$1; shift; timeout ${T:-150} python benchmarks/bench_planner.py "$@" --out $OUT/planner_$tag.txt > /tmp/log_$tag.txt 2>&1 || tail -5 /tmp/log_$tag.txt
  grep -v "^#" $OUT/planner_$tag.txt | grep -v "^$" | grep -v "^## verdicts" | grep -v "^model\|^---" | head -30; }
run moe_top2_flops --only moe_top2 --op-costs flops
run convnet_bn --only convnet_bn
timeout 170 python benchmarks/probe_op_costs.py --only gpt_scanned --out $OUT/opcosts_gpt_scanned.txt > /tmp/log_p.txt 2>&1 || tail -5 /tmp/log_p.txt
grep -v "^#" $OUT/opcosts_gpt_scanned.txt | head -30
T=170 run gpt_scanned --only gpt_scanned
