#!/bin/bash
# Session 15: device time per kernel of the Llama block's fused steps (XLA's order vs consume-first), ViT for contrast.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 250 python benchmarks/probe_kernel_times.py $m --rounds 20 --top 30 --out $OUT/probe_kernel_times_$m.txt > /tmp/log_$m.txt 2>&1 || tail -20 /tmp/log_$m.txt
  grep -v "^#" $OUT/probe_kernel_times_$m.txt | head -60
done
