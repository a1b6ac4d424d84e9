#!/bin/bash
# Session 16: goal 3 (offload) with the planner's copy headroom (DeviceModel.headroom 1.25), on the GPT-2
# 2-head block and the Llama block. Arg: models (default both).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
for m in ${@:-gpt2_block_2h llama_block}; do
  timeout 285 python benchmarks/bench_offload.py --only $m --rounds 7 --out $OUT/offload_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/offload_$m.txt | grep -E "jaxaot|verdict|met|MISSED|noise|budget" | cut -c1-150 | head -40
done
