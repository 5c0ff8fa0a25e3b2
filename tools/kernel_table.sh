#!/usr/bin/env bash
# Where a decode step's time goes: for each batch size, one full-depth decode
# step's kernels (Nsight Compute: duration and DRAM bytes of every kernel of
# one step, clocks left alone), the step's graph-replay time with and without
# the row-parallel all-reduces, and the device-to-device copy bandwidth, all
# measured in this one run; tools/kernel_table.py turns them into the table
# (per-kernel time, bytes, fraction of the copy bandwidth, launch gaps,
# all-reduce time, floor of the step).
#   tools/kernel_table.sh [--tp 2] [--model llama-8b-shape] [--overrides layers=32]
#       [--batches "1 8 32 64"] [--context 1024] [--out DIR] [-- launcher flags]
# Needs a GPU per rank, ncu on the PATH (or NCU=...), $SYMTP_BIN (default
# build/tools/symtp) and python3 with PyTorch (the copy bandwidth). At TP > 1
# the all-reduces' cost is the step time with them minus the step time
# without them (--bench-skip-allreduce), the kernels are one rank's shapes
# profiled in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
TP=1 MODEL=llama-8b-shape OVERRIDES=layers=32 BATCHES="1 8 32 64" CTX=1024 OUT=kernel_table
EXTRA=()
while (($#)); do
  case $1 in
    --tp) TP=$2; shift 2;; --model) MODEL=$2; shift 2;; --overrides) OVERRIDES=$2; shift 2;;
    --batches) BATCHES=$2; shift 2;; --context) CTX=$2; shift 2;; --out) OUT=$2; shift 2;;
    -h|--help) sed -n '2,15p' "$0"; exit 0;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "kernel_table.sh: unknown argument $1 (--help)" >&2; exit 2;;
  esac
done
SYMTP_BIN=${SYMTP_BIN:-build/tools/symtp}
NCU=${NCU:-ncu}
mkdir -p "$OUT"
SHARD=$OVERRIDES
[[ $TP -gt 1 ]] && SHARD=$(python3 tools/kernel_table.py --print-shard-overrides --tp "$TP" \
  --model "$MODEL" --overrides "$OVERRIDES")

python3 - "$OUT/copy_bandwidth.json" <<'EOF'
import json, sys, torch
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); e.synchronize(); times.append(s.elapsed_time(e) / 1e3)
t = sorted(times)[len(times) // 2]
json.dump({"bytes_per_s": 2 * n / t, "what": "1 GiB device-to-device copy, read + write"},
          open(sys.argv[1], "w"))
EOF

steady() {  # batch, skip-allreduce, out dir
  local args=(--backend=cuda --tp="$TP" --model="$MODEL" --model-overrides="$OVERRIDES"
              --steady-batch="$1" --max-batch="$1" --steady-context="$CTX" --max-batched-tokens=8192
              --prefill-chunk=8192 --progress=false --bench-skip-allreduce="$2" "${EXTRA[@]}")
  "$SYMTP_BIN" "${args[@]}" --steady-steps=40 --warmup-steps=5 --out="$3" >"$3.log" 2>&1
}

for b in $BATCHES; do
  echo "=== batch $b: graph step time" >&2
  steady "$b" false "$OUT/b$b.ar"
  [[ $TP -gt 1 ]] && steady "$b" true "$OUT/b$b.noar"
  echo "=== batch $b: kernels of one step (ncu)" >&2
  # Skip set-up and warm-up, then profile a window of a little over two
  # steps; kernel_table.py cuts one whole step out of it. At TP > 1 the
  # profiled run is one process (ncu serializes kernels across processes, so
  # ranks waiting for each other would deadlock): a TP = 1 model with one
  # rank's shapes (heads, KV heads, FFN and vocabulary divided by TP).
  layers=${OVERRIDES#*layers=}; layers=${layers%%,*}
  per_step=$(( ${layers:-32} * 10 + 16 ))
  prefill_steps=$(( (b * CTX + 8191) / 8192 ))
  timeout "${NCU_TIMEOUT_S:-180}" "$NCU" --target-processes all --clock-control none --graph-profiling node \
    --launch-skip $((per_step * (prefill_steps + 3))) --launch-count $((per_step * 2 + 40)) \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --page raw --print-units base --log-file "$OUT/b$b.ncu.csv" \
    "$SYMTP_BIN" --backend=cuda --tp=1 --model="$MODEL" --model-overrides="$SHARD" \
    --steady-batch="$b" --max-batch="$b" --steady-context="$CTX" --max-batched-tokens=8192 \
    --prefill-chunk=8192 --progress=false --step-timeout-ms=600000 \
    --steady-steps=6 --warmup-steps=1 --out="$OUT/b$b.ncu" "${EXTRA[@]}" >"$OUT/b$b.ncu.log" 2>&1 ||
    echo "ncu run failed (batch $b): $(tail -3 "$OUT/b$b.ncu.log")" >&2
done
python3 tools/kernel_table.py --tp "$TP" --model "$MODEL" --overrides "$OVERRIDES" \
  --context "$CTX" --batches "$BATCHES" --dir "$OUT"
