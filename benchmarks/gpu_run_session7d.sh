#!/bin/bash
# The module step with the patched nnx.value_and_grad, then the planner on the other models gelu touches.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 200 python benchmarks/bench_module_step.py --rounds 5 --steps 8 --out $OUT/module_step_gpu_${D}_patched.txt 2>&1 | grep -v "^W\|^I0" | grep "^##\|^nnx.jit \|jaxaot opt" | tail -16
bash benchmarks/gpu_run_session7c.sh gpt2_block_8h issue_block transformer_block 2>&1 | grep "^  \|^## "
