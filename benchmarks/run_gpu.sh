#!/usr/bin/env bash
# Run chosen benchmarks on a GPU machine, optionally after the test suite, from the repository root:
#
#   PYTHONPATH=. bash benchmarks/run_gpu.sh [--tests] [BENCH ...]
#
# BENCH names a benchmark (benchmarks/bench_<BENCH>.py), or while_loop_long (bench_while_loop.py
# --long); none runs them all, in the order of ALL below (with --tests alone, only the tests run). Each writes
# benchmarks/results/<BENCH>_<kind>.txt, where <kind> names the device: gpu_h100, gpu_h200, cpu, ...
# (pipeline and sharding use every device and add xN on a machine of N > 1 devices: gpu_h200x2).
# docs/benchmarks.md says what each measures and holds its current table.
#
# Settings (environment):
#   ARGS_<BENCH>="..."  more arguments for one benchmark, e.g. ARGS_fused="--only llama_block --rounds 9"
#   NAME_<BENCH>=...    its results file's name before _<kind>.txt, where the arguments measure another table,
#                       e.g. NAME_cache=cache_fused with ARGS_cache="--step value_and_grad"
#   TIMEOUT=540         seconds each benchmark (and the test suite) may run; one that catches timeout's SIGTERM
#                       (bench_budget) writes its results file with what it measured, and the file is kept
#   TESTS="tests/..."   what --tests runs (default: the whole suite but the notebooks), with -n WORKERS (16)
#
# --tests writes benchmarks/results/tests_<kind>[xN].txt: the machine, the summary line and every failure.
#
# With $OUT set (the folder a device machine sends back), $OUT/run_gpu.log is the whole console output
# and $OUT/results_<kind>.tar.gz holds the results files and every run's log (run_gpu_logs/). The archive is rewritten
# after each step, so a call stopped at its time limit still returns what finished. Back home, from
# the repository root:  tar -xzf results_<kind>.tar.gz benchmarks/results
set -u
export PYTHONPATH=.:${PYTHONPATH:-} PYTHONUNBUFFERED=1
# Test workers share one GPU, and some benchmarks hold two programs' buffers at once: no preallocation.
export XLA_PYTHON_CLIENT_PREALLOCATE=false

ALL="core partitioners fused planner budget offload module_step compiled_autograd cache while_loop while_loop_long
     sharding pipeline"
MULTI_DEVICE="sharding pipeline"

tests=0
benches=()
for arg in "$@"; do
  case "$arg" in
    --tests) tests=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) benches+=("$arg") ;;
  esac
done
[ ${#benches[@]} -eq 0 ] && [ $tests -eq 0 ] && read -r -a benches <<< "$(echo $ALL)"

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/run_gpu.log") 2>&1
fi

read -r kind devices < <(python3 - <<'EOF'
import jax
from benchmarks.harness import device_tag
print(device_tag(), jax.device_count())
EOF
)
[ -n "${kind:-}" ] || { echo "jax found no device"; exit 1; }
python3 -c "import jax, sys; print(sys.version.split()[0], 'jax', jax.__version__, jax.devices())"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null

results=benchmarks/results
logs=${TMPDIR:-/tmp}/run_gpu_logs
mkdir -p "$results" "$logs"
written=()

pack() {  # the results written so far and every log, into $OUT (when set)
  [ -n "${OUT:-}" ] || return 0
  tar -czf "$OUT/results_$kind.tar.gz.part" "${written[@]}" -C "$(dirname "$logs")" run_gpu_logs && mv "$OUT/results_$kind.tar.gz.part" "$OUT/results_$kind.tar.gz"
}

if [ $tests -eq 1 ]; then
  tag=$kind
  [ "$devices" -gt 1 ] && tag=${kind}x$devices
  echo "== tests -> $results/tests_$tag.txt"
  start=$SECONDS
  # -v names each test as it ends: at the time limit, the tests that never ended are listed.
  # shellcheck disable=SC2086
  timeout -k 30 "${TIMEOUT:-540}" python3 -m pytest ${TESTS:-tests --ignore=tests/test_notebooks.py} -v -rfEs \
    --durations=20 -n "${WORKERS:-16}" -p no:cacheprovider > "$logs/tests_$tag.log" 2>&1
  status=$?
  {
    echo "# python -m pytest ${TESTS:-tests --ignore=tests/test_notebooks.py} -n ${WORKERS:-16}: exit $status after $((SECONDS - start)) s"
    python3 -c "import jax; print('#', 'jax', jax.__version__, jax.device_count(), 'x', jax.devices()[0].device_kind)"
    grep -E '^(FAILED|ERROR|SKIPPED)' "$logs/tests_$tag.log" | cut -c1-300
    if [ $status -eq 124 ] || [ $status -eq 137 ]; then
      grep -oE '(FAILED|ERROR) tests/[^ ]+' "$logs/tests_$tag.log" | sort -u
      # shellcheck disable=SC2086
      python3 -m pytest ${TESTS:-tests --ignore=tests/test_notebooks.py} --collect-only -q -p no:cacheprovider 2>/dev/null \
        | grep '::' | sort > "$logs/collected.txt"
      grep -oE '(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) tests/[^ ]+' "$logs/tests_$tag.log" | cut -d' ' -f2 | sort -u \
        | comm -23 "$logs/collected.txt" - | sed 's/^/# not finished: /'
    fi
    sed -n '/slowest .*durations/,/^$/p' "$logs/tests_$tag.log" | grep -E '^[0-9.]+s ' | sed 's/^/# slow: /'
    tail -1 "$logs/tests_$tag.log"
  } > "$results/tests_$tag.txt"
  written+=("$results/tests_$tag.txt")
  cat "$results/tests_$tag.txt"
  pack
fi

for b in "${benches[@]}"; do
  script=bench_$b extra=()
  [ "$b" = while_loop_long ] && script=bench_while_loop extra=(--long)
  if [ ! -f "benchmarks/$script.py" ]; then
    echo "== $b: no benchmarks/$script.py (choose from: $(echo $ALL))"
    continue
  fi
  tag=$kind
  if [[ " $MULTI_DEVICE " == *" $b "* ]]; then
    [ "$devices" -gt 1 ] && tag=${kind}x$devices
    [ "$b" = pipeline ] && [ "$devices" -gt 1 ] && extra+=(--devices "$devices")
  fi
  var=ARGS_$b
  name=NAME_$b
  out=$results/${!name:-$b}_$tag.txt
  echo "== $b -> $out"
  start=$SECONDS
  rm -f "$out"  # a file there afterwards is this run's: a benchmark stopped by timeout may write what it measured
  # shellcheck disable=SC2086
  timeout "${TIMEOUT:-540}" python3 -m "benchmarks.$script" "${extra[@]}" ${!var:-} --out "$out" \
    > "$logs/${b}_$tag.log" 2>&1
  status=$?
  echo "$b: exit $status after $((SECONDS - start)) s"
  if [ -f "$out" ] && { [ $status -eq 0 ] || [ $status -eq 124 ]; }; then
    written+=("$out")
    grep -v '^#' "$out" | head -60
  else
    tail -20 "$logs/${b}_$tag.log"
  fi
  pack
done
