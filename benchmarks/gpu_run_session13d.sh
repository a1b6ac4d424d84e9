#!/bin/bash
# Session 13: the fused and split steps of the offloading min-cut at budget 1, every variant (probe_fused_variants --offload).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 200 python benchmarks/probe_fused_variants.py $m --offload --rounds 9 --out $OUT/variants_offload_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/variants_offload_$m.txt | grep -v "^$"
done
