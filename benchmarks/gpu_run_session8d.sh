#!/bin/bash
# Session 8: the fused step with the layout choice (fused_exe compiles XLA's layouts and row-major
# residuals, keeps one by compiled peak), on the models where fused ran slower than split.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 570 python benchmarks/bench_fused.py --only vit_block,llama,moe,issue,gpt2_block_2h,convnet --rounds 7 \
  --out $OUT/fused_gpu_${D}_layouts.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^$"
