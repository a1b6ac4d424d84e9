#!/bin/bash
# Session 11: what should choose the fused step's layouts and order (probe_layout_choice), per zoo model.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
for m in "$@"; do
  timeout 280 python benchmarks/probe_layout_choice.py $m --rounds 9 --out $OUT/layout_choice_$m.txt > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
  grep -v "^#" $OUT/layout_choice_$m.txt | grep -v "^$"
done
