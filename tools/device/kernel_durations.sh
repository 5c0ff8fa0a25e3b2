#!/usr/bin/env bash
# Kernel durations as the GPU ran them (Nsight Systems CUDA trace, no
# serialization, no cache flushes): runs kernels_bench --sections $SECTIONS
# (default sm90probe) under nsys on the device machine and writes, under
# $OUT, the trace's per-kernel summary: for each (kernel, grid, block) the
# launch count and the median / min duration in microseconds.
#   run(kind=nvidia-h200, carry=[".deps"], command="tools/device/kernel_durations.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
tools/device/build.sh kernels_bench >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
[[ -n $NSYS ]] || { echo "no nsys on this machine"; exit 2; }
timeout 300 "$NSYS" profile --trace=cuda --cuda-graph-trace=node --sample=none --cpuctxsw=none -o "$OUT/trace" --force-overwrite true \
  build-gpu/bench/kernels/kernels_bench --sections "${SECTIONS:-sm90probe}" >"$OUT/kernels.txt" 2>&1
echo "nsys profile: exit $?"
timeout 200 "$NSYS" stats --report cuda_gpu_trace --format csv --output "$OUT/gpu_trace" "$OUT/trace.nsys-rep" \
  >"$OUT/stats.log" 2>&1
echo "nsys stats: exit $?"
csv=$(ls "$OUT"/gpu_trace*.csv 2>/dev/null | head -1)
[[ -n $csv ]] || { tail -20 "$OUT/stats.log"; exit 3; }
python3 - "$csv" >"$OUT/kernel_durations.txt" <<'PY'
import csv, statistics, sys
rows = {}
with open(sys.argv[1]) as f:
    for r in csv.DictReader(f):
        name = r.get("Name", "")
        if not name or name.startswith("[CUDA"):
            continue
        grid = "%sx%sx%s" % (r.get("GrdX"), r.get("GrdY"), r.get("GrdZ"))
        block = "%sx%sx%s" % (r.get("BlkX"), r.get("BlkY"), r.get("BlkZ"))
        key = (name[:110], grid, block)
        rows.setdefault(key, []).append(float(r["Duration (ns)"]) / 1000.0)
print("%7s %9s %9s  %-14s %-10s %s" % ("launches", "median us", "min us", "grid", "block", "kernel"))
for (name, grid, block), d in sorted(rows.items(), key=lambda kv: -len(kv[1])):
    print("%7d %9.2f %9.2f  %-14s %-10s %s" % (len(d), statistics.median(d), min(d), grid, block, name))
PY
head -60 "$OUT/kernel_durations.txt"
rm -f "$OUT/trace.sqlite" "$OUT/trace.nsys-rep"; gzip -f "$csv"
