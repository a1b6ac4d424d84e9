#!/bin/bash
# Session 9: which temporaries are live at the compiled peak (issue block, ConvNet).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
for m in issue_block convnet_bn; do
  rm -rf /tmp/dump
  XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=fused_|ref_" \
    timeout 250 python benchmarks/probe_peak_buffers.py $m /tmp/dump --layouts row_major 2>&1 | grep -v "^W\|^I0" \
    | tee -a $OUT/probe_peak_buffers_gpu_${D}.txt
  mkdir -p $OUT/hlo_$m && cp /tmp/dump/*jit_fused_mincut.*after_optimizations.txt /tmp/dump/*jit_ref_dots*after_optimizations.txt $OUT/hlo_$m/ 2>/dev/null
done
