#!/bin/bash
# The eager module step after the optimizer reuses the gradient's traversal (and raw reads/writes).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 300 python benchmarks/bench_module_step.py --rounds 7 --steps 8 --out $OUT/module_step_gpu_${D}_traversal.txt 2>&1 | grep -v "^W\|^I0" | grep "^#\|^nnx\|^aot\|^jaxaot\|^eager" | tail -45
