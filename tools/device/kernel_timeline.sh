#!/usr/bin/env bash
# The in-graph kernel timeline of decode steps (common/kernel_trace.h): a
# build with -DSYMTP_KERNEL_TRACE=ON (build-trace/) whose kernels record each
# block's entry, first grid-dependency wait and exit (%globaltimer), one symtp
# decode job per shape with SYMTP_KERNEL_TRACE_OUT set (recording stops when
# the batch first shrinks, so the ring keeps the full-batch steps), and
# tools/kernel_timeline.py's table of each rank: per kernel, its exposed time
# on the step's critical path, how early its blocks entered and how long after
# the previous kernel's end its wait released; one layer launch by launch.
# The recording adds a few percent to the step: each shape also runs once in
# the normal build (build-gpu/), and both step times are reported.
# TIMELINE_ARGS: more symtp flags for every job (e.g. a study flag).
# SHAPES: "TP:BATCH ..." (default "2:1 2:4 2:32 1:1"), llama-8b-shape, 32
# layers, context 1024, CUDA graphs. Writes $OUT/kernel_timeline.md (every
# shape's rank-0 table, and at TP > 1 each kernel's own span on every rank)
# and .json (every rank's), the per-rank files under $OUT/timeline/.
#   run(kind=nvidia-h100-x2, carry=[".deps"], command="tools/device/kernel_timeline.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/device_env.sh
W=$(mktemp -d)
TRACE=1 tools/device/build.sh symtp >"$OUT/trace_build.log" 2>&1 || { tail -30 "$OUT/trace_build.log"; exit 1; }
tools/device/build.sh symtp >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
mkdir -p "$OUT/timeline"
p50() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['steps']['decode_forward_us']['p50'])" "$1"; }
job() {  # bin tp batch out
  "$1" launch --backend=cuda --tp="$2" --model=llama-8b-shape --model-overrides=layers=32 \
    --steady-batch="$3" --max-batch="$3" --steady-context=1024 --steady-steps=12 --warmup-steps=3 \
    --max-batched-tokens=8192 --prefill-chunk=8192 --progress=false ${TIMELINE_ARGS:-} --out="$4" >"$4.out" 2>"$4.log"
}
rc=0
: >"$OUT/kernel_timeline.md"
echo "{" >"$W/all.json"
sep=""
for shape in ${SHAPES:-2:1 2:4 2:32 1:1}; do
  tp=${shape%%:*} b=${shape##*:} n=tp${shape%%:*}_b${shape##*:}
  job build-gpu/tools/symtp "$tp" "$b" "$W/ref_$n" || { echo "$n: symtp failed"; tail -5 "$W/ref_$n.log"; rc=1; continue; }
  SYMTP_KERNEL_TRACE_OUT=$W/$n job build-trace/tools/symtp "$tp" "$b" "$W/o_$n" ||
    { echo "$n: symtp (recording) failed"; tail -5 "$W/o_$n.log"; rc=1; continue; }
  ref=$(p50 "$W/ref_$n/summary.json") rec=$(p50 "$W/o_$n/summary.json")
  { echo "## TP $tp, batch $b"; echo
    echo "Decode step p50: $ref us (normal build), $rec us (recording)."; echo; } >>"$OUT/kernel_timeline.md"
  for ((r = 0; r < tp; ++r)); do
    python3 tools/kernel_timeline.py "$W/$n.rank$r.bin" --json "$OUT/timeline/${n}_rank$r.json" --expect-step-us "$rec" \
      >"$OUT/timeline/${n}_rank$r.md" 2>&1 || { cat "$OUT/timeline/${n}_rank$r.md"; rc=1; continue; }
    printf '%s"%s_rank%d": {"step_us": %s, "step_us_recording": %s, "timeline": %s}' "$sep" "$n" "$r" \
      "$ref" "$rec" "$(cat "$OUT/timeline/${n}_rank$r.json")" >>"$W/all.json"
    sep=$',\n'
  done
  cat "$OUT/timeline/${n}_rank0.md" >>"$OUT/kernel_timeline.md"; echo >>"$OUT/kernel_timeline.md"
  if ((tp > 1)); then
    { echo "Own span per launch on every rank:"; echo
      python3 tools/kernel_timeline.py --compare-ranks "$OUT"/timeline/"${n}"_rank*.json; echo; } \
      >>"$OUT/kernel_timeline.md" 2>&1 || rc=1
  fi
done
echo "}" >>"$W/all.json"
python3 -c "import json,sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2], 'w'), indent=1)" \
  "$W/all.json" "$OUT/kernel_timeline.json" || rc=1
cat "$OUT/kernel_timeline.md"
rm -rf "$W"
exit $rc
