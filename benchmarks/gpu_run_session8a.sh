#!/bin/bash
# Session 8: where the fused min-cut step's peak comes from (issue block, ViT, MoE), then the planner
# on the models the knapsack's tie order changes (GPT-2 2 heads) or that were dominated (MoE).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 330 python benchmarks/probe_fused_peak.py issue_block vit_block moe_top2 --rounds 7 \
  --out $OUT/probe_fused_peak_gpu_${D}.txt 2>&1 | grep -v "^W\|^I0" | tail -45
bash benchmarks/gpu_run_session7c.sh gpt2_block_2h moe_top2 2>&1 | grep "^  \|^## "
