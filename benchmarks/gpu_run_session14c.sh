#!/bin/bash
# Session 14: goal 3 with the copy-slot cap (DeviceModel.copy_slots), and the copy-slot tests on the card.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import jax, jaxaot; print(jaxaot.DeviceModel.measure())"
timeout 60 python -m pytest -q -p no:cacheprovider tests/partition/test_copy_slots.py 2>&1 | tail -2
for m in "$@"; do
  timeout 260 python benchmarks/bench_offload.py --only $m --rounds 7 --out $OUT/offload_$m.txt > /tmp/log_$m.txt 2>&1 || tail -5 /tmp/log_$m.txt
  grep -E "verdicts|met|MISSED|noise|price|budget|offload" $OUT/offload_$m.txt | grep -v "^#" | cut -c1-200
done
