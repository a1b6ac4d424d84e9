#!/bin/bash
# Session 9: XLA's order vs consume-first, 21 rounds, with XLA's bytes-accessed estimate beside the time.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 560 python benchmarks/probe_fused_order.py llama_block transformer_block issue_block moe_top2 vit_block gpt2_block_2h \
  --budgets 1 --rounds 21 --out $OUT/probe_fused_order_gpu_${D}_bytes.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^$"
