#!/usr/bin/env bash
# Kernel durations (gpu__time_duration, Nsight Compute, clocks and caches left
# alone) of the kernels a kernels_bench section launches, grouped by kernel
# and grid: the kernel's own time, without the launch gaps that event timing
# and graph replays include. The machine has ncu but no nsys.
#   KERNEL: ncu kernel-name regex (default: cuBLASLt's kernels: nvjet_*, or
#           names holding gemm / xmma / cutlass in lower case);
#   SECTIONS: kernels_bench sections (default gemm);
#   BENCH_ARGS: more kernels_bench arguments (e.g. "--model-batches 32,256
#           --model-kernels tensor-core --model-graphs off" for a decode step).
#   PROFILE_FROM_START: "off" records only the launches between
#           cudaProfilerStart / Stop (the model section brackets one step per
#           table row); kernel_sequence.txt then lists every launch in order.
#   run(kind=nvidia-h200, carry=[".deps"], command="tools/device/kernel_durations.sh")
# Writes $OUT/kernel_durations.txt (launches, median / min us, grid, block,
# name), $OUT/ncu.csv.gz and kernels_bench's own output.
set -uo pipefail
source "$(dirname "$0")/ncu_setup.sh"
timeout 480 "$NCU" --clock-control none --cache-control none --profile-from-start "${PROFILE_FROM_START:-on}" --kernel-name "regex:${KERNEL:-nvjet|gemm|xmma|cutlass}" \
  --metrics gpu__time_duration.sum --csv --print-units base \
  build-gpu/bench/kernels/kernels_bench --sections "${SECTIONS:-gemm}" ${BENCH_ARGS:-} >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "ncu: exit $?"
python3 - "$OUT/ncu.csv" "$OUT/kernel_sequence.txt" >"$OUT/kernel_durations.txt" <<'PY'
import csv, statistics, sys
rows = {}
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]  # the CSV part (ncu also prints the app's output)
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    key = (r["Kernel Name"][:120], r["Grid Size"], r["Block Size"])
    rows.setdefault(key, []).append(float(r["Metric Value"].replace(",", "")) / 1000.0)
if len(sys.argv) > 2:  # every launch in order
    with open(sys.argv[2], "w") as f:
        f.write("%5s %9s  %-16s %-12s %s\n" % ("id", "us", "grid", "block", "kernel"))
        for r in csv.DictReader(lines):
            if r.get("Metric Name") == "gpu__time_duration.sum":
                f.write("%5s %9.2f  %-16s %-12s %s\n" % (r["ID"], float(r["Metric Value"].replace(",", "")) / 1000.0,
                        r["Grid Size"], r["Block Size"], r["Kernel Name"][:120]))
print("%8s %9s %9s  %-16s %-12s %s" % ("launches", "median us", "min us", "grid", "block", "kernel"))
for (name, grid, block), d in sorted(rows.items(), key=lambda kv: -len(kv[1])):
    print("%8d %9.2f %9.2f  %-16s %-12s %s" % (len(d), statistics.median(d), min(d), grid, block, name))
PY
grep -v '^"' "$OUT/ncu.csv" | grep -v "^==PROF==" >"$OUT/kernels.txt"
gzip -f "$OUT/ncu.csv"
cat "$OUT/kernel_durations.txt"
tail -3 "$OUT/ncu.err"
