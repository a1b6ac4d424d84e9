#!/bin/bash
# Session 9: consume-first with lazy recomputation (runtime.ordering), against XLA's order; peak temporaries.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 380 python benchmarks/probe_fused_order.py issue_block transformer_block moe_top2 vit_block llama_block gpt2_block_2h \
  --budgets 1 --rounds 15 --out $OUT/probe_fused_order_gpu_${D}_lazy.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^$"
rm -rf /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=fused_mincut" \
  timeout 150 python benchmarks/probe_peak_buffers.py issue_block /tmp/dump --layouts row_major 2>&1 | grep -v "^W\|^I0" \
  > $OUT/probe_peak_buffers_lazy_gpu_${D}.txt
grep -A7 "## fused_mincut" $OUT/probe_peak_buffers_lazy_gpu_${D}.txt | cut -c1-170
mkdir -p $OUT/hlo && cp /tmp/dump/*jit_fused_mincut_consume_first.*after_optimizations.txt $OUT/hlo/ 2>/dev/null
