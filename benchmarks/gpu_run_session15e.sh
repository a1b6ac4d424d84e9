#!/bin/bash
# Session 15: goal 2 (fused step) with residuals pinned in the order the backward reads them. Arg: comma-separated models, a tag.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 570 python benchmarks/bench_fused.py --only $1 --rounds 7 --out $OUT/fused_$2.txt > /tmp/log.txt 2>&1 || tail -5 /tmp/log.txt
grep -v "^#" $OUT/fused_$2.txt | cut -c1-175
