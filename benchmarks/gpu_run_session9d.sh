#!/bin/bash
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
rm -rf /tmp/dump
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=fused_mincut_consume" \
  timeout 150 python benchmarks/probe_peak_buffers.py issue_block /tmp/dump --layouts row_major > /dev/null 2>&1
python benchmarks/_tmp_fusions.py /tmp/dump > $OUT/fusions.txt 2>&1; head -c 20000 $OUT/fusions.txt
