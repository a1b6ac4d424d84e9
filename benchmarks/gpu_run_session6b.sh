#!/bin/bash
# Second call: the module step again (leaner Optimizer), and the offline schedule's accuracy at highest matmul precision.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
timeout 250 python benchmarks/bench_module_step.py --rounds 5 --steps 8 --out $OUT/module_step_gpu_${D}_optimizer_b.txt 2>&1 | grep -v "^W\|^I0" | grep "^#\|^nnx\|^aot\|^jaxaot\|^eager" | tail -45
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 200 python benchmarks/bench_while_loop.py --repeats 2 --ks 2 --out $OUT/while_loop_gpu_h100_${D}_offline_highest_precision.txt 2>&1 | grep -v "^W\|^I0\|^  \|Traceback\|callback failed" | sed -n 5,20p
timeout 100 env JAX_DEFAULT_MATMUL_PRECISION=highest python -m pytest -q -p no:cacheprovider tests/loops/test_offline.py 2>&1 | tail -3
