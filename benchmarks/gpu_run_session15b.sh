#!/bin/bash
# Session 15: the Llama block's orders in both residual layouts, with their optimized HLO; the other consume-first models.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/hlo
PROBE_LAYOUTS=both PROBE_HLO_DIR=/tmp/hlo timeout 280 python benchmarks/probe_order_subsets.py llama_block --rounds 11 \
  --out $OUT/probe_order_subsets_llama_block_layouts.txt > /tmp/log_l.txt 2>&1 || tail -5 /tmp/log_l.txt
grep -v "^#" $OUT/probe_order_subsets_llama_block_layouts.txt
tar czf $OUT/hlo_llama.tar.gz -C /tmp/hlo .
for m in "$@"; do
  timeout 200 python benchmarks/probe_order_subsets.py $m --rounds 9 --out $OUT/probe_order_subsets_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/probe_order_subsets_$m.txt
done
