#!/usr/bin/env bash
# Where a decode step's time goes (llama-8b-shape, all $LAYERS layers,
# context 1024, bf16, CUDA graphs). For each TP in $TPS and batch in
# $BATCHES: symtp's steady decode (its step's graph-replay time with and, at
# TP > 1, without the all-reduces, and the keys its median step attends
# over), then every kernel of one decode step at those keys (Nsight Compute
# over kernels_bench's model section, which brackets one graph-replayed step
# per batch with cudaProfilerStart/Stop: duration and DRAM bytes, clocks and
# caches left alone); with the device-to-device copy bandwidth and the
# read-only stream's rate (tools/device/read_bandwidth.sh), all in this one
# run. tools/kernel_table.py makes the table ($OUT/kernel_table.md and
# .json). At TP > 1 the profiled step is one rank's: a TP = 1 model with that
# rank's shapes (heads, KV heads, FFN and vocabulary divided by TP; ncu
# serializes kernels, so two ranks waiting for each other cannot be profiled),
# with AddRmsNorm kernels where the rank's norms run in the all-reduce.
#   run(kind=nvidia-h100-x2, carry=[".deps"], command="tools/device/kernel_table.sh")
set -uo pipefail
source "$(dirname "$0")/ncu_setup.sh"
tools/device/build.sh symtp >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
TPS=${TPS:-1 2} BATCHES=${BATCHES:-1,8,32,64} LAYERS=${LAYERS:-32}
python3 - "$OUT/copy_bandwidth.json" <<'PY'
import json, sys, torch
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t = []
for _ in range(10):
    s.record(); b.copy_(a); e.record(); e.synchronize(); t.append(s.elapsed_time(e) / 1e3)
json.dump({"bytes_per_s": 2 * n / sorted(t)[5], "what": "1 GiB device-to-device copy, read + write"},
          open(sys.argv[1], "w"))
PY
# The read-only stream's rate beside it (the table's read floor).
OUT="$OUT" tools/device/read_bandwidth.sh >/dev/null 2>"$OUT/read_bandwidth.err" ||
  echo "read_bandwidth.sh failed (no read floor): $(tail -2 "$OUT/read_bandwidth.err")"
for tp in $TPS; do
  for b in ${BATCHES//,/ }; do
    for skip in false $([[ $tp -gt 1 ]] && echo true); do
      timeout 120 build-gpu/tools/symtp --backend=cuda --tp="$tp" --model=llama-8b-shape \
        --model-overrides="layers=$LAYERS" --steady-batch="$b" --max-batch="$b" --steady-context=1024 \
        --max-batched-tokens=8192 --prefill-chunk=8192 --steady-steps=40 --warmup-steps=5 \
        --progress=false --bench-skip-allreduce=$skip --out="$OUT/tp$tp.b$b.skip$skip" \
        >"$OUT/tp$tp.b$b.skip$skip.log" 2>&1 || echo "symtp TP=$tp batch $b failed"
    done
  done
  # The profiled step attends over the keys symtp's median step did.
  ov=$(python3 tools/kernel_table.py --print-shard-overrides --tp "$tp")
  keys=$(python3 tools/kernel_table.py --print-keys --dir "$OUT" --tp "$tp" --batches "$BATCHES")
  timeout 240 "$NCU" --clock-control none --cache-control none --profile-from-start off \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --print-units base \
    build-gpu/bench/kernels/kernels_bench --sections model --layers "$LAYERS" --model-batches "$BATCHES" \
    --model-contexts "$keys" --model-kernels tensor-core --model-graphs on ${ov:+--model-overrides "$ov"} \
    --model-defer-norm=$([[ $tp == 1 ]] && echo true || echo false) \
    >"$OUT/tp$tp.ncu.csv" 2>"$OUT/tp$tp.ncu.err" || echo "ncu TP=$tp failed: $(tail -2 "$OUT/tp$tp.ncu.err")"
done
python3 tools/kernel_table.py --dir "$OUT" --tps "$TPS" --batches "$BATCHES" --layers "$LAYERS"
