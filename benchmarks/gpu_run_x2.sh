#!/usr/bin/env bash
# One nvidia-h200-x2 call (issue #20): the sharding and pipeline tests on both GPUs,
# bench_sharding and bench_pipeline on both, then bench_fused on one GPU with what time is left.
set -u
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import jax, sys; print(sys.version); print('jax', jax.__version__, jax.devices())" | tee "$OUT/env.txt"
timeout 150 python3 -m pytest tests/runtime/test_shardings.py tests/parallel/test_pipeline.py \
  tests/parallel/test_bw_split.py -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/tests_gpu_x2.txt"
timeout 170 python3 benchmarks/bench_sharding.py --rounds 5 --iters 5 2>&1 | tee "$OUT/sharding_gpu_h200x2.txt" | tail -40
timeout 200 python3 benchmarks/bench_pipeline.py --devices 2 --measured 4,8,16 --rounds 5 2>&1 \
  | tee "$OUT/pipeline_gpu_h200x2.txt" | tail -60
CUDA_VISIBLE_DEVICES=0 timeout ${FUSED_SECONDS:-60} python3 benchmarks/bench_fused.py --rounds 5 --iters 3 \
  --only ${FUSED_ONLY:-issue,llama} 2>&1 | tee "$OUT/fused_gpu_h200.txt" | tail -40
