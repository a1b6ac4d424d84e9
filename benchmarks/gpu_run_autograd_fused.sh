#!/usr/bin/env bash
# One single-GPU call (issues #15, #16): compiled-autograd tests on jax 0.11.2, bench_compiled_autograd,
# and bench_fused (selective barrier against the all-barrier form).
set -u
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import jax, sys; print(sys.version); print('jax', jax.__version__, jax.devices())" | tee "$OUT/env.txt"
N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
timeout 170 python3 -m pytest tests/autograd -q -p no:cacheprovider $N 2>&1 | tail -8 | tee "$OUT/tests_autograd_gpu.txt"
timeout 200 python3 benchmarks/bench_compiled_autograd.py --rounds 3 --steps 5 2>&1 \
  | tee "$OUT/compiled_autograd_gpu.txt" | tail -40
timeout 170 python3 benchmarks/bench_fused.py --rounds 5 --iters 3 --only ${FUSED_ONLY:-issue,llama,gpt2} 2>&1 \
  | tee "$OUT/fused_gpu.txt" | tail -40
