#!/bin/bash
# Session 14: the price of offloading each saved value alone (probe_offload_price), and the HLO of the copies.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 280 python benchmarks/probe_offload_price.py $m --rounds 9 --out $OUT/offload_price_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/offload_price_$m.txt | grep -v "^$"
done
