#!/usr/bin/env bash
# On the device machine: build, GPU tests ($TESTS), then tools/overlap.sh
# for each "TP:MODEL:OVERRIDES:SHAPES" entry of $PLANS (one overlap table per
# entry under $OUT), with the arms of $ARMS_<n> (or $ARMS) and $REPEATS repeats;
# $TESTS lists GPU test binaries and filters to run first. Each step
# checks the time left ($BUDGET_S, default 560 s) and skips rather than overrun.
#   run(kind=nvidia-h100-x2, carry=[".deps"], command="PLANS='2:llama-8b-shape:layers=32:decode256@1024' tools/device/overlap_run.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/device_env.sh
START=$(date +%s)
BUDGET_S=${BUDGET_S:-560}
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
log() { echo "=== $(date +%T) [$(left) s left] $*"; }
log "device"; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  log "build"
  tools/device/build.sh symtp ${BUILD_TARGETS:-kernels_test} >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
fi
export SYMTP_BIN=$PWD/build-gpu/tools/symtp
# $TESTS: "BINARY:GTEST_FILTER ..." (BINARY under build-gpu/tests/*/).
for t in ${TESTS:-}; do
  bin=${t%%:*} filter=${t#*:}
  log "gpu tests: $bin $filter"
  timeout $(( $(left) - 30 )) build-gpu/tests/*/"$bin" --gtest_filter="$filter" >>"$OUT/tests.log" 2>&1
  echo "$bin exit $?"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/tests.log" | tail -6
done
i=0
for plan in ${PLANS:-}; do
  IFS=: read -r tp model ov shapes <<<"$plan"
  i=$((i + 1))
  if (( $(left) < ${MIN_LEFT_S:-60} )); then log "skip $plan: too little time left"; continue; fi
  log "overlap $plan"
  arms_var=ARMS_$i; arms=${!arms_var:-${ARMS:-off=--exchange-min-rows=0 on=}}
  timeout $(( $(left) - 10 )) tools/overlap.sh --tp "$tp" --model "$model" --overrides "$ov" \
    --shapes "${shapes//,/ }" --repeats "${REPEATS:-1}" --arms "$arms" \
    ${NOAR:+--noar} --out "$OUT/ov$i" -- ${EXTRA:-} 2>"$OUT/ov$i.err" | tail -n +3
  tail -3 "$OUT/ov$i.err"
  # Keep only the tables and per-run summaries' step statistics.
  (cd "$OUT" && tar czf "ov$i.tgz" "ov$i.err" "ov$i"/*.md "ov$i"/*.json "ov$i"/*/summary.json \
     "ov$i"/*.log 2>/dev/null; rm -rf "ov$i" "ov$i.err")
done
log "done"
