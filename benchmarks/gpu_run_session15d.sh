#!/bin/bash
# Session 15: residuals pinned in the order the backward reads them (layouts="read_order") against row-major, both orders.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false PROBE_LAYOUTS=row_major,read_order PROBE_SINGLES=0
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 200 python benchmarks/probe_order_subsets.py $m --rounds 9 --out $OUT/probe_read_order_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/probe_read_order_$m.txt
done
