#!/bin/bash
# Session 13: every variant the fused min-cut step weighs, timed with its compiled peak (probe_fused_variants).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 190 python benchmarks/probe_fused_variants.py $m --rounds 9 --out $OUT/variants_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/variants_$m.txt | grep -v "^$"
done
