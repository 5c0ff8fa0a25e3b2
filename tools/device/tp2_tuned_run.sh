#!/usr/bin/env bash
# TP=2 GEMM tuning inside the runtime and what it buys (docs/DEVICE.md, item 6), on
# nvidia-h200-x2, in phases that each fit one device call (10 minutes):
#   run(kind=nvidia-h200-x2, carry=[".deps"], command="PHASE=tune tools/device/tp2_tuned_run.sh")
#   run(kind=nvidia-h200-x2, carry=[".deps"], command="PHASE=ab tools/device/tp2_tuned_run.sh")
#   run(kind=nvidia-h200-x2, carry=[".deps"], command="PHASE=more tools/device/tp2_tuned_run.sh")
# PHASE=tune: build everything, then the in-run tuning at TP=2 (runtime_gemm_tune.sh: an A/A
#   control and the picks per layer count, LAYERS x BATCHES), the tables copied to
#   build-gpu/tp2_tables/ for the next phase on a warm machine; then, while time is left,
#   kernels_bench --sections gemm (the card's ceilings and the heuristic's per-call rates).
# PHASE=ab: the steady decode at TP=2 without and with those tables in separate processes
#   (decode_table_ab.sh), then the GPU tests and launch checks (gpu_run.sh STEPS="test launch").
#   TABLE_DIR points elsewhere when the machine went cold (e.g. the committed results).
# PHASE=more: the 32-layer decode sweep at TP=2 (graphs on) and the overlap levers
#   (--comm-priority=high, --gemm-sm-margin=16).
# Each phase writes $OUT/<phase>_*.tar.gz and $OUT/<phase>.log; a step is skipped (and says
# so) when less time is left than it needs, so a phase ends inside the call's limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$PWD/out}
PHASE=${PHASE:-tune}
BUDGET_S=${BUDGET_S:-570}
LAYERS=${LAYERS:-4 32} BATCHES=${BATCHES:-256 512}
TABLE_DIR=${TABLE_DIR:-$PWD/build-gpu/tp2_tables}
LOG=$OUT/$PHASE.log
mkdir -p "$OUT"
say() { echo "=== $(date +%T) (${SECONDS}s) $*" | tee -a "$LOG"; }
left() { echo $((BUDGET_S - SECONDS)); }
# fits NEED_S NAME: true when the step fits in what is left of the budget.
fits() {
  if (($(left) < $1)); then say "skipped $2: $(left) s left, it needs ~$1 s"; return 1; fi
  say "$2"
}
say "phase $PHASE on $(nvidia-smi -L | wc -l) GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
case $PHASE in
  tune)
    say "build"
    tools/device/build.sh >"$OUT/build.log" 2>&1 || { say "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
    if fits 200 "in-run tuning at TP=2 (layers $LAYERS, batches $BATCHES)"; then
      TP=2 LAYERS="$LAYERS" BATCHES="$BATCHES" AB_ROUNDS=0 TAG=tune_tp2 \
        timeout $(($(left) - 20)) tools/device/runtime_gemm_tune.sh 2>&1 | tee -a "$LOG"
      mkdir -p "$TABLE_DIR" && tar xzf "$OUT/tune_tp2.tar.gz" -C "$TABLE_DIR" --strip-components=1 \
        --wildcards '*/table_L*.txt' && say "tables kept: $(ls "$TABLE_DIR" | tr '\n' ' ')"
    fi
    if fits 100 "kernels_bench --sections gemm (ceilings, heuristic per call)"; then
      mkdir -p "$OUT/kernels"
      timeout $(($(left) - 10)) build-gpu/bench/kernels/kernels_bench --sections gemm \
        --json "$OUT/kernels/kernels_gemm.json" >"$OUT/kernels/kernels_gemm.txt" 2>&1
      grep -iE "ceiling|TFLOP/s \(" "$OUT/kernels/kernels_gemm.txt" | head -5 | tee -a "$LOG"
      tar czf "$OUT/tune_kernels.tar.gz" -C "$OUT" kernels && rm -rf "$OUT/kernels"
    fi
    ;;
  ab)
    tools/device/build.sh >"$OUT/build.log" 2>&1 || { say "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
    for L in $LAYERS; do
      T=$TABLE_DIR/table_L$L.txt
      [[ -f $T ]] || { say "no table $T: skipped"; continue; }
      if fits 150 "separate processes at TP=2, $L layers, without / with $T"; then
        TABLE=$T TP=2 LAYERS=$L BATCHES="$BATCHES" ROUNDS=${AB_ROUNDS:-2} SWEEP_DIR=ab_tp2_L$L \
          timeout $(($(left) - 15)) tools/device/decode_table_ab.sh 2>&1 | tee -a "$LOG"
      fi
    done
    if fits 200 "GPU tests and launch checks"; then
      OUT=$OUT/gpu STEPS="test launch" timeout $(($(left) - 10)) tools/device/gpu_run.sh >/dev/null 2>&1
      grep -E "tests passed|tests failed|exit|plans from" "$OUT/gpu/gpu_run.log" | tee -a "$LOG"
      mv "$OUT/gpu/results.tar.gz" "$OUT/ab_gpu_results.tar.gz"; mv "$OUT/gpu/gpu_run.log" "$OUT/ab_gpu_run.log"
      rm -rf "$OUT/gpu"
    fi
    ;;
  more)
    tools/device/build.sh symtp >"$OUT/build.log" 2>&1 || { say "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
    mkdir -p "$OUT/more"
    if fits 150 "decode sweep, llama-8b-shape 32 layers, TP=2, graphs on"; then
      SYMTP_BIN=build-gpu/tools/symtp timeout $(($(left) - 10)) tools/decode_sweep.sh \
        --models llama-8b-shape --overrides layers=32 --tps 2 --graphs true \
        --batches "32 128 256 512" --steps 100 --out "$OUT/more/decode_L32_tp2" \
        >"$OUT/more/decode_L32_tp2.log" 2>&1
      tail -8 "$OUT/more/decode_L32_tp2.log" | tee -a "$LOG"
    fi
    for lever in --comm-priority=high --gemm-sm-margin=16; do
      if fits 120 "overlap at TP=2 with $lever"; then
        n=overlap_${lever#--}; n=${n%%=*}
        SYMTP_BIN=build-gpu/tools/symtp timeout $(($(left) - 10)) tools/overlap.sh --tp 2 --k 4 \
          --model llama-70b-shape --overrides layers=4 --out "$OUT/more/$n" -- "$lever" \
          >"$OUT/more/$n.log" 2>&1
        tail -12 "$OUT/more/$n.log" | tee -a "$LOG"
      fi
    done
    find "$OUT/more" \( -name tokens.jsonl -o -name prompts.jsonl \) -delete
    tar czf "$OUT/more_results.tar.gz" -C "$OUT" more && rm -rf "$OUT/more"
    ;;
  *) echo "tp2_tuned_run.sh: PHASE is tune, ab or more" >&2; exit 2;;
esac
say "done"
