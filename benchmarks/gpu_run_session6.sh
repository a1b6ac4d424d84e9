#!/bin/bash
# One device call: the while_loop benchmark (offline schedule) and the eager module step (jaxaot.nn.Optimizer).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 280 python benchmarks/bench_while_loop.py --out $OUT/while_loop_gpu_h100_${D}_offline.txt 2>&1 | grep -v "^W\|^I0\|^  \|Traceback\|callback failed" | tail -30
timeout 280 python benchmarks/bench_module_step.py --rounds 5 --steps 8 --out $OUT/module_step_gpu_${D}_optimizer.txt 2>&1 | grep -v "^W\|^I0" | grep "^#\|^nnx\|^aot\|^jaxaot\|^eager" | tail -45
