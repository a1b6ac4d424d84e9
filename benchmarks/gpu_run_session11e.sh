#!/bin/bash
# Session 11: max/min reductions recomputable in the fused min-cut step (probe_max_recompute).
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
for m in "$@"; do
  timeout 150 python benchmarks/probe_max_recompute.py $m --rounds 9 --out $OUT/maxcheap_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/maxcheap_$m.txt | grep -v "^$"
done
