#!/usr/bin/env bash
# GEMM tuning inside the runtime (--gemm-tune-out): per layer count, a steady decode per batch
# size whose workers alternate cuBLASLt's heuristic and autotuned picks step by step (A B B A)
# and write the faster set into one table per layer count; then (AB_ROUNDS > 0) the runtime's
# steady decode with and without that table in separate processes, alternated
# (tools/device/decode_table_ab.sh): the figure that counts where the GPU runs at its power
# cap, since alternating arms share one clock (git show 6fe628f:bench/results/h200-2026-11-24/README.md, runs aw, ax).
#   run(kind=nvidia-h200, carry=[".deps"], command="tools/device/runtime_gemm_tune.sh")
# Variables: LAYERS ("4 32"), BATCHES ("256 512"), TP (1), ROUNDS (48), WINDOW (1),
# CANDIDATES (16), CONTROL (1: first an A/A run, candidates 1, per layer count at the first
# batch: the noise floor of the in-run comparison), AB_ROUNDS (2), TEST_FILTER (kernels_test
# cases to run first, e.g. '*GemmPlanSets*:*Tuning*'), TAG (tune: the folder and tarball
# name). Writes $OUT/$TAG.tar.gz (tables, their .json verdicts, logs, summary.md) and, with
# AB_ROUNDS, $OUT/sweep_L<layers>.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$PWD/out}
LAYERS=${LAYERS:-4 32} BATCHES=${BATCHES:-256 512} TP=${TP:-1} ROUNDS=${ROUNDS:-48}
WINDOW=${WINDOW:-1} CANDIDATES=${CANDIDATES:-16}
TAG=${TAG:-tune}
W=$OUT/$TAG
mkdir -p "$W"
trap 'tar czf "$OUT/$TAG.tar.gz" -C "$OUT" "$TAG" && rm -rf "$W"' EXIT
if [[ -n ${TEST_FILTER:-} ]]; then  # e.g. '*Retuned*:*Tuning*': kernels_test cases first
  tools/device/build.sh symtp kernels_test >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  build-gpu/tests/kernels/kernels_test --gtest_filter="$TEST_FILTER" >"$W/tests.log" 2>&1
  echo "kernels_test $TEST_FILTER: rc $? $(grep -E '^\[  (PASSED|FAILED)' "$W/tests.log" | tr '\n' ' ')"
else
  tools/device/build.sh symtp >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
STEPS=$((4 * WINDOW * ROUNDS + 3 + 20))
tune() {  # layers batch candidates table log
  timeout 400 build-gpu/tools/symtp launch --backend=cuda --tp="$TP" --model=llama-8b-shape \
    --model-overrides="layers=$1" --steady-batch="$2" --max-batch="$2" --steady-context=1024 \
    --steady-steps="$STEPS" --warmup-steps=5 --max-batched-tokens=4096 --prefill-chunk=4096 \
    --progress=false --gemm-tune-out="$4" --gemm-tune-rounds="$ROUNDS" --gemm-tune-window="$WINDOW" \
    --gemm-tune-candidates="$3" --out="$W/run_$(basename "$5" .log)" >"$5" 2>&1
  local rc=$?
  rm -f "$W/run_$(basename "$5" .log)"/{tokens,prompts}.jsonl
  echo "layers $1 batch $2 candidates $3 (rc $rc): $(grep -h "GEMM tuning at batch" "$5" | sed 's/.*GEMM tuning/GEMM tuning/')"
}
{
  echo "# In-run GEMM tuning: llama-8b-shape, TP=$TP, context 1024, $ROUNDS rounds of $WINDOW-step windows"
  echo
  set -- $BATCHES; B0=$1
  for L in $LAYERS; do
    if [[ ${CONTROL:-1} == 1 ]]; then
      tune "$L" "$B0" 1 "$W/control_L${L}.txt" "$W/control_L${L}_b$B0.log"
    fi
    for B in $BATCHES; do
      tune "$L" "$B" "$CANDIDATES" "$W/table_L$L.txt" "$W/tune_L${L}_b$B.log"
      cp "$W/table_L$L.txt.json" "$W/table_L${L}_b$B.json" 2>/dev/null
    done
  done
} | tee "$W/summary.md"
if [[ ${AB_ROUNDS:-2} -gt 0 ]]; then
  for L in $LAYERS; do
    TABLE=$W/table_L$L.txt LAYERS=$L BATCHES="$BATCHES" ROUNDS=$AB_ROUNDS SWEEP_DIR=sweep_L$L \
      tools/device/decode_table_ab.sh
  done
fi
