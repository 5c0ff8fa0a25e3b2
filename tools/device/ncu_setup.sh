# Sourced by the Nsight Compute scripts (profile_attention.sh,
# kernel_durations.sh): repository root, $OUT, the carried .deps libraries,
# kernels_bench built, $NCU found. kernels_bench's timing gate is switched
# off: a profiled launch waits for its kernel, which would wait for the gate.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMTP_BENCH_NO_GATE=1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
tools/device/build.sh kernels_bench >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "no ncu on this machine"; exit 2; }
