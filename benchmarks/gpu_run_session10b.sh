#!/bin/bash
# Session 10: goal 3 again, the device model measured in-program (device bandwidth was 13x low: dispatch).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "
from jaxaot.partition.offload import DeviceModel; import time; t=time.time(); print(DeviceModel.measure(), time.time()-t)"
python benchmarks/bench_offload.py --rounds 9 --out $OUT/offload_gpu.txt 2>&1 | tail -c 20000 > $OUT/offload_gpu_log.txt
tail -12 $OUT/offload_gpu_log.txt
