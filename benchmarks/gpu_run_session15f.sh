#!/bin/bash
# Session 15: goal 3 (offload) on one model with residuals pinned in their read order. Arg: model substring.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 250 python benchmarks/bench_offload.py --only $1 --rounds 7 --out $OUT/offload_$1.txt > /tmp/log.txt 2>&1 || tail -5 /tmp/log.txt
grep -v "^#" $OUT/offload_$1.txt | grep -E "verdict|met|MISSED|noise|fused|split|x " | cut -c1-170 | head -40
