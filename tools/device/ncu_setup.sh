# Sourced by the Nsight Compute scripts (profile_attention.sh,
# kernel_durations.sh): repository root, $OUT, the carried .deps libraries,
# kernels_bench built, $NCU found. kernels_bench's timing gate is switched
# off: a profiled launch waits for its kernel, which would wait for the gate.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source tools/device/device_env.sh
export SYMTP_BENCH_NO_GATE=1
tools/device/build.sh kernels_bench >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "no ncu on this machine"; exit 2; }
