#!/bin/bash
# Host-memory snapshots: the 100,000-step loop (and 10,000 against lax.scan), then the tests on the GPU.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import jax; print(jax.__version__, jax.devices()[0].addressable_memories())"
timeout 420 python benchmarks/bench_while_loop.py --long --repeats 3 --out $OUT/while_loop_long_gpu_${D}.txt 2>&1 | grep -v "^W\|^I0" | tail -14
timeout 120 python -m pytest -q -p no:cacheprovider tests/loops/test_host_snapshots.py 2>&1 | tail -3
