set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 270 python3 benchmarks/bench_pipeline.py --devices 2 --measured 8,16 --rounds 5 2>&1 | tee $OUT/pipeline_gpu_h200x2_m8_16.txt | grep -v "^W1123\|^\*" | tail -45
CUDA_VISIBLE_DEVICES=0 timeout 110 python3 benchmarks/bench_fused.py --rounds 5 --iters 3 --only issue,gpt2_block_8h 2>&1 | tee $OUT/fused_gpu_h200_b.txt | tail -25
CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/probe_offload.py 2>&1 | tee $OUT/offload_probe_gpu_h200.txt | tail -30
