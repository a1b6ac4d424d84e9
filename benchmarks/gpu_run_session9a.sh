#!/bin/bash
# Session 9: shared vs per-use recomputation in the fused step, budgets 1 and 0.75, at-risk models.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 560 python benchmarks/probe_fused_recompute.py issue_block convnet_bn vit_block llama_block \
  --budgets 1,0.75 --rounds 15 --out $OUT/probe_fused_recompute_gpu_${D}.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^$"
