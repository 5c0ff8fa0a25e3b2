#!/usr/bin/env bash
# Runs the CPU benchmarks (ring, diff protocol, scheduler planning, CPU model)
# and writes Google Benchmark JSON under OUT (default bench/results/cpu-<host>).
# Uses the release build (tools/quickstart.sh makes it), building if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${SYMTP_BUILD_DIR:-build-release}
OUT=${OUT:-bench/results/cpu-$(hostname -s)}
mkdir -p "$OUT"
if [[ ! -x $B/bench/protocol/protocol_bench ]]; then
  source tools/lib/deps.sh; symtp_install_deps
  cmake --preset release >/dev/null
  cmake --build --preset release -j "$(symtp_jobs)" --target protocol_bench scheduler_bench ipc_bench model_bench
fi
for b in protocol/protocol_bench scheduler/scheduler_bench ipc/ipc_bench model/model_bench; do
  name=$(basename "$b")
  [[ -x $B/bench/$b ]] || { echo "bench_cpu: $B/bench/$b missing" >&2; continue; }
  echo "=== $name" >&2
  "$B/bench/$b" --benchmark_out="$OUT/$name.json" --benchmark_out_format=json \
    ${BENCH_ARGS:-} >"$OUT/$name.txt" 2>&1 || echo "bench_cpu: $name failed" >&2
done
echo "bench_cpu: results in $OUT" >&2
