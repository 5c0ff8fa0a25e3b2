#!/usr/bin/env bash
# Nsight Compute on the tensor-core decode attention kernel (device machine,
# Firecracker kinds: ncu reads the counters there). Builds kernels_bench,
# runs only its decode-attention section under ncu and profiles chosen
# launches of MmaDecodeKernel (KERNEL=...; --launch-skip counts launches of
# that kernel only; every tensor-core launch of the section runs it, groups
# being <= 8). Writes $OUT/ncu_*.txt. SECTIONS=... profiles another
# kernels_bench section. BENCH_ARGS adds kernels_bench
# arguments, e.g. KERNEL=SampleKernel SECTIONS=model BENCH_ARGS="--model-batches 32
# --model-kernels tensor-core --model-graphs off" CASES="sample_b32:8".
#   run(kind=nvidia-h200, carry=[".deps"], command="tools/device/profile_attention.sh")
# Launch order in the section: per shape (llama-8b tp1 and tp2, llama-70b
# tp2), the tensor-core variants chunk 256, 512, 1024, planned, each at batch
# 1, 8, 32, 64, 128, 256, 512, each config 1 check + 5 warm-up + 30 timed
# launches (36).
set -uo pipefail
source "$(dirname "$0")/ncu_setup.sh"
per_config=36
KERNEL=${KERNEL:-MmaDecodeKernel}
# launch_index S V B: launches of the tensor-core kernel to skip to reach a
# timed launch (the 11th) of shape S (0: llama-8b tp1, 1: llama-8b tp2, 2:
# llama-70b tp2), variant V (0-2: chunk 256, 512, 1024; 3: planned) and batch
# index B (0-6: batch 1 ... 512).
launch_index() { echo $(( ((($1 * 4) + $2) * 7 + $3) * per_config + 10 )); }
CASES=${CASES:-"8b_plan_b256:$(launch_index 0 3 5) 8b_tp2_plan_b32:$(launch_index 1 3 2)
  70b_plan_b32:$(launch_index 2 3 2)"}
for c in $CASES; do
  name=${c%%:*}
  skip=${c##*:}
  timeout 240 "$NCU" --clock-control none --kernel-name "regex:$KERNEL" \
    --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__warps_launched.sum" \
    build-gpu/bench/kernels/kernels_bench --sections "${SECTIONS:-attention}" ${BENCH_ARGS:-} >"$OUT/ncu_$name.txt" 2>&1
  echo "== $name (skip $skip): exit $?"
  grep -E "$KERNEL"'|issue_stalled|inst_executed|warps_launched|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|Block Limit|Registers Per|Dynamic Shared|Grid Size|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall|One or More' "$OUT/ncu_$name.txt" | head -70
done
# SOURCE=1: per-instruction stall samples of the first case (ncu source page,
# SASS) and the kernel's SASS from the object file, for reading the key loop.
if [[ ${SOURCE:-0} == 1 ]]; then
  first=${CASES%% *}
  timeout 240 "$NCU" --clock-control none --kernel-name "regex:$KERNEL" \
    --launch-skip "${first##*:}" --launch-count 1 --section SourceCounters --section WarpStateStats \
    --page source --print-source sass --csv \
    build-gpu/bench/kernels/kernels_bench --sections "${SECTIONS:-attention}" ${BENCH_ARGS:-} >"$OUT/ncu_source_${first%%:*}.csv" 2>&1
  echo "== source page of ${first%%:*}: exit $? ($(wc -l <"$OUT/ncu_source_${first%%:*}.csv") lines)"
  CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
  obj=$(find build-gpu -name 'mma_decode_bf16.cu.o' | head -1)
  if [[ -n $CUOBJDUMP && -n $obj ]]; then
    "$CUOBJDUMP" -sass "$obj" >"$OUT/mma_decode.sass" 2>&1
    echo "== SASS: $(grep -c HMMA "$OUT/mma_decode.sass") HMMA lines in $(wc -l <"$OUT/mma_decode.sass") lines"
  fi
fi
