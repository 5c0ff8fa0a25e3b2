#!/usr/bin/env bash
# On the GPU (device) machine: build allreduce_test + allreduce_bench, run the
# tests (then the GPU cases again TEST_REPEAT times, shuffled), then the
# benchmark (and a second configuration when BENCH2_ARGS is set); logs and JSON
# under $OUT. Knobs (env): TEST_ARGS, TEST_TIMEOUT, TEST_REPEAT, BENCH_ARGS,
# BENCH2_ARGS, BENCH_TIMEOUT, TP.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/allreduce_out}
mkdir -p "$OUT"
{ nvidia-smi topo -m; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv; } \
  > "$OUT/topo.txt" 2>&1
head -3 "$OUT/topo.txt"
t0=$SECONDS
tools/device/build.sh allreduce_test allreduce_bench > "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }
grep -i "warning" "$OUT/build.log" | head -5
echo "build: $((SECONDS - t0)) s"
T=build-gpu/tests/allreduce/allreduce_test
t0=$SECONDS
timeout -s KILL "${TEST_TIMEOUT:-100}" $T ${TEST_ARGS:-} > "$OUT/test.log" 2>&1
echo "test rc=$? ($((SECONDS - t0)) s)"
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|FAILED:|\[TP " "$OUT/test.log" | head -70
if [[ ${TEST_REPEAT:-0} -gt 0 ]]; then
  t0=$SECONDS
  timeout -s KILL "${TEST_TIMEOUT:-100}" $T --gtest_filter='AllReduceGpu*' \
    --gtest_repeat="$TEST_REPEAT" --gtest_shuffle > "$OUT/test_repeat.log" 2>&1
  echo "repeat x$TEST_REPEAT rc=$? ($((SECONDS - t0)) s): $(grep -c '^\[       OK \]' "$OUT/test_repeat.log") OK," \
    "$(grep -c '^\[  FAILED  \] AllReduce' "$OUT/test_repeat.log") FAILED"
fi
B=build-gpu/bench/allreduce/allreduce_bench
t0=$SECONDS
timeout -s KILL "${BENCH_TIMEOUT:-80}" $B --tp "${TP:-2}" ${BENCH_ARGS:-} --json "$OUT/bench.json" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($((SECONDS - t0)) s)"
grep -v "^\[\|^I " "$OUT/bench.log" | head -60
if [[ -n ${BENCH2_ARGS:-} ]]; then
  timeout -s KILL "${BENCH_TIMEOUT:-80}" $B --tp "${TP:-2}" $BENCH2_ARGS --json "$OUT/bench2.json" \
    > "$OUT/bench2.log" 2>&1
  echo "bench2 ($BENCH2_ARGS) rc=$?"
  grep -E "^# custom|custom " "$OUT/bench2.log" | head -14
fi
