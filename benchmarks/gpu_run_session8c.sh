#!/bin/bash
# Session 8: fused steps with residuals pinned to row-major layouts (XLA picked batch-minor layouts and
# transposes in the fused ViT step; the split step has none of them).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 560 python benchmarks/probe_fused_peak.py vit_block moe_top2 llama_block gpt2_block_2h issue_block --brief \
  --rounds 7 --out $OUT/probe_fused_layouts_gpu_${D}.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^#\|^$\|split executable"
