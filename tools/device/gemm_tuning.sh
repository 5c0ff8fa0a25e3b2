#!/usr/bin/env bash
# GEMM tuning tables on the device machine, end to end:
#   1. the tuning-table GPU tests (and the autotune / GpuModel ones);
#   2. kernels_bench --sections modelab (per TP in AB_TPS, default "1"; TP > 1
#      runs rank 0's shard alone): a 4-layer llama-8b decode step with
#      cuBLASLt's heuristic GEMMs against autotuned picks, all of them and one
#      shape at a time, in interleaved rounds; the picks that make the step
#      faster go to $OUT/gemm_tuning_tp<N>.txt (a table for --gemm-tuning-file);
#   3. the runtime with and without that table (TP = 1, steady batch
#      $LAUNCH_BATCH, context 1024, the TP = 1 table): decode forward time, which plans came
#      from the table, and whether the tokens match.
#   run(kind=nvidia-h200, carry=[".deps"], command="tools/device/gemm_tuning.sh")
# Variables: TEST_FILTER, AB_BATCHES (default 256,512), AB_ARGS (more
# kernels_bench flags, e.g. "--model-ab-candidates 8 --model-ab-rounds 9"),
# LAUNCH_BATCH (default 256), LAYERS (default 4). Everything lands in
# $OUT/gemm_tuning.tar.gz (logs, JSON, the tables).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/out}
FINAL=$OUT
OUT=$FINAL/gemm_tuning  # packed into $FINAL/gemm_tuning.tar.gz at the end (few files come back)
mkdir -p "$OUT"
trap 'find "$OUT" -name tokens.jsonl -size +8M -delete; tar czf "$FINAL/gemm_tuning.tar.gz" -C "$FINAL" gemm_tuning && rm -rf "$OUT"' EXIT
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
B=build-gpu
LAYERS=${LAYERS:-4}
tools/device/build.sh kernels_test kernels_bench symtp >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "== tests"
timeout 300 $B/tests/kernels/kernels_test --gtest_filter="${TEST_FILTER:-*Tuning*:*Autotune*:GpuModel*}" >"$OUT/tests.log" 2>&1
echo "kernels_test exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|^/.*: error" "$OUT/tests.log" | head -20
for tp in ${AB_TPS:-1}; do
  echo "== modelab tp $tp"
  timeout 400 $B/bench/kernels/kernels_bench --sections modelab --layers "$LAYERS" --model-tp "$tp" \
    --model-batches "${AB_BATCHES:-256,512}" ${AB_ARGS:-} --model-tuning-out "$OUT/gemm_tuning_tp$tp.txt" \
    --json "$OUT/modelab_tp$tp.json" >"$OUT/modelab_tp$tp.txt" 2>&1
  echo "kernels_bench exit $?"; grep -v "^[IDW] " "$OUT/modelab_tp$tp.txt" | tail -40
done
[[ -f $OUT/gemm_tuning_tp1.txt ]] || exit 0
echo "== runtime with and without the table"
b=${LAUNCH_BATCH:-256}
for t in heuristic table; do
  d=$OUT/launch_$t
  extra="--gemm-tuning-file=none"  # the heuristic, not the shipped table (auto)
  [[ $t == table ]] && extra="--gemm-tuning-file=$OUT/gemm_tuning_tp1.txt"
  timeout 180 $B/tools/symtp launch --backend=cuda --tp=1 --model=llama-8b-shape \
    --model-overrides=layers=$LAYERS --steady-batch=$b --max-batch=$b --steady-context=1024 \
    --steady-steps=200 --warmup-steps=10 --max-batched-tokens=4096 --prefill-chunk=4096 \
    --progress=false $extra --out="$d" >"$d.log" 2>&1
  echo "launch $t exit $?: decode forward p50 $(python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('%.1f us' % s['steps']['decode_forward_us']['p50'])" "$d/summary.json" 2>/dev/null)"
done
echo "plans from the table: $(grep -c "from the tuning table" "$OUT/launch_table.log")"
grep "from the tuning table" "$OUT/launch_table.log" | sed 's/.*\] //' | head -12
echo "tokens equal: $(cmp -s "$OUT/launch_heuristic/tokens.jsonl" "$OUT/launch_table/tokens.jsonl" && echo yes || echo no)"
