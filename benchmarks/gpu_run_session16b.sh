#!/bin/bash
# Session 16: the fused step's variants on the GPT-2 2-head block below budget 1, where the fused step ran
# slower than the split executables of the same plan (goal 3's qkv pair): offload at 0.7, no offload at 0.5.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 280 python benchmarks/probe_fused_variants.py gpt2_block_2h --offload --budget_pct 70 --rounds 9 --out $OUT/variants_offload70.txt > $OUT/log1.txt 2>&1 || tail -5 $OUT/log1.txt
grep -v "^#" $OUT/variants_offload70.txt | cut -c1-300
timeout 250 python benchmarks/probe_fused_variants.py gpt2_block_2h --budget_pct 50 --rounds 9 --out $OUT/variants_50.txt > $OUT/log2.txt 2>&1 || tail -5 $OUT/log2.txt
grep -v "^#" $OUT/variants_50.txt | cut -c1-300
