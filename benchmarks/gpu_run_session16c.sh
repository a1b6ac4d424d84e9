#!/bin/bash
# Session 16: what offloading costs on the GPT-2 2-head block at min-cut budget 0.5 (planner's offload
# price 1.05x fused / 1.11x split there) and at 1 (the plan's 48 MiB qkv value, slack 1.0x), value by value.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for b in 50 100; do
  timeout 280 python benchmarks/probe_offload_price.py gpt2_block_2h --budget_pct $b --rounds 7 --out $OUT/price_$b.txt > $OUT/log_$b.txt 2>&1 || tail -5 $OUT/log_$b.txt
  grep -v "^#" $OUT/price_$b.txt | cut -c1-60,100-110,175-300
done
