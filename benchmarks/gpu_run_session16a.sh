#!/bin/bash
# Session 16: goal 3 (offload) with residuals pinned in their read order, on the goal-3 models whose fused
# programs the read-order pins changed (GPT-2 2-head block, transformer block). The scanned GPT has no such
# residual; the Llama block was re-measured in session 15.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import jax; print(jax.__version__, jax.devices())"
for m in gpt2_block_2h transformer_block; do
  timeout 270 python benchmarks/bench_offload.py --only $m --rounds 7 --out $OUT/offload_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/offload_$m.txt | grep -E "verdict|met|MISSED|noise|fused|split|x " | cut -c1-170 | head -40
done
