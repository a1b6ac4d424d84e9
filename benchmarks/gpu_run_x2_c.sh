#!/usr/bin/env bash
# One nvidia-h200-x2 call (issues #20, #18): pipeline tests on both GPUs; bench_pipeline (tuned
# zero-bubble, back-to-back op times) at 8 and 16 microbatches; then the module step on one GPU.
set -u
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import jax, sys; print(sys.version); print('jax', jax.__version__, jax.devices())" | tee "$OUT/env.txt"
timeout 100 python3 -m pytest tests/parallel/test_pipeline.py tests/parallel/test_schedule.py tests/nn/test_eager_grad.py \
  -q -p no:cacheprovider -x 2>&1 | tail -8 | tee "$OUT/tests_gpu_x2.txt"
timeout 280 python3 benchmarks/bench_pipeline.py --devices 2 --measured 8,16 --rounds 5 2>&1 \
  | grep -v "^W1\|^I1\|^\*" | tee "$OUT/pipeline_gpu_h200x2.txt" | tail -50
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/bench_module_step.py --rounds 5 --steps 8 2>&1 \
  | tee "$OUT/module_step_gpu_h200.txt" | tail -60
