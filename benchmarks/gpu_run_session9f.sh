#!/bin/bash
# Session 9: temporaries live at the consume-first step's peak (issue and transformer blocks).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
for m in issue_block transformer_block; do
  rm -rf /tmp/dump
  XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=fused_mincut|ref_dots" \
    timeout 200 python benchmarks/probe_peak_buffers.py $m /tmp/dump --layouts row_major 2>&1 | grep -v "^W\|^I0" \
    >> $OUT/probe_peak_buffers_consume_first_gpu_${D}.txt
  mkdir -p $OUT/hlo_$m && cp /tmp/dump/*jit_fused_mincut_consume_first.*after_optimizations.txt $OUT/hlo_$m/ 2>/dev/null
done
grep -A9 "## fused_mincut_consume\|## ref_dots\|^# " $OUT/probe_peak_buffers_consume_first_gpu_${D}.txt | cut -c1-170
