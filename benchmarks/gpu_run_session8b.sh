#!/bin/bash
# Session 8: the optimized HLO and buffer assignment of fused vs split steps (issue block, ViT), then the
# planner on the models not re-measured since the cost-model fixes.
export PYTHONPATH=. XLA_PYTHON_CLIENT_PREALLOCATE=false
D=$(date +%F)
XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*lambda.*|.*loss.*|.*forward.*|.*backward.*" \
  timeout 200 python benchmarks/probe_fused_hlo.py /tmp/hlo issue_block vit_block 2>&1 | grep -v "^W\|^I0" | tail -16
(cd /tmp/dump && ls | grep -c . ; tar czf $OUT/dump_buffers.tgz $(ls | grep "buffer-assignment\|memory-usage" | head -80))
tar czf $OUT/hlo.tgz -C /tmp hlo
bash benchmarks/gpu_run_session7c.sh llama_block convnet_bn gru_scan gpt_scanned 2>&1 | grep "^  \|^## "
