#!/bin/bash
# Session 15: which consume-first matmuls make the fused step's peak, and what each order costs.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 280 python benchmarks/probe_order_subsets.py $m --rounds 9 --out $OUT/probe_order_subsets_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  cat $OUT/probe_order_subsets_$m.txt | grep -v "^#"
done
