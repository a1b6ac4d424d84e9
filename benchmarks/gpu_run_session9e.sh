#!/bin/bash
# Session 9: the fused step with the layout and backward-order choices, on the zoo. Part $1 of 2.
# (Run first with eager recomputation in runtime.ordering, then with lazy: ..._order_lazy_part*.)
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
if [ "$1" = 1 ]; then ONLY=issue_block,llama,vit_block,gpt2_block_2h,moe,convnet; else ONLY=gpt2_block_8h,gru,gpt_scanned,transformer; fi
timeout 575 python benchmarks/bench_fused.py --only $ONLY --rounds 9 \
  --out $OUT/fused_gpu_${D}_order_lazy_part$1.txt 2>&1 | grep -v "^W\|^I0" | grep -v "^---\|^$"
