#!/bin/bash
# Session 9: the fused step's backward in XLA's order or consume-first (runtime.ordering), budget 1.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 420 python benchmarks/probe_fused_order.py issue_block llama_block vit_block gpt2_block_2h moe_top2 convnet_bn \
  --budgets 1 --rounds 15 --out $OUT/probe_fused_order_gpu_${D}.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^$"
rm -rf /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=fused_|ref_" \
  timeout 150 python benchmarks/probe_peak_buffers.py issue_block /tmp/dump --layouts row_major 2>&1 | grep -v "^W\|^I0" \
  > $OUT/probe_peak_buffers_order_gpu_${D}.txt
grep -A6 "## " $OUT/probe_peak_buffers_order_gpu_${D}.txt | cut -c1-150
