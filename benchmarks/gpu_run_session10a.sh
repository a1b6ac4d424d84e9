#!/bin/bash
# Session 10: goal 3 of issue 16 (offload against JAX's offload policies), with offload inside scan bodies.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
python benchmarks/bench_offload.py --rounds 9 --out $OUT/offload_gpu.txt 2>&1 | tail -c 20000 > $OUT/offload_gpu_log.txt
tail -60 $OUT/offload_gpu_log.txt
