#!/bin/bash
# Session 14: probe_offload_price again, with the planner's offloads on the plan without offloading, and the compiled HLO.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false PROBE_HLO_DIR=$OUT/hlo
mkdir -p $PROBE_HLO_DIR
nvidia-smi --query-gpu=name --format=csv,noheader
for m in "$@"; do
  timeout 280 python benchmarks/probe_offload_price.py $m --rounds 9 --out $OUT/offload_price_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -v "^#" $OUT/offload_price_$m.txt | grep -v "^$" | cut -c1-400
done
cd $PROBE_HLO_DIR && gzip *.txt
