#!/usr/bin/env bash
# On the device machine: configure and build (Release, sm_90) from the carried
# tree, using the Abseil/GoogleTest/benchmark staged in .deps/ by
# tools/device/stage_deps.sh. Arguments: targets to build (default: all).
# Build dir: build-gpu/ (kept between calls on a warm machine); with
# TRACE=1 build-trace/, configured with -DSYMTP_KERNEL_TRACE=ON (the kernels
# record an in-graph timeline: tools/device/kernel_timeline.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PREFIX=$PWD/.deps/prefix/usr
[[ -d $PREFIX ]] || { echo "build.sh: $PREFIX missing: run tools/device/stage_deps.sh here and carry .deps" >&2; exit 2; }
export LD_LIBRARY_PATH=$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
DIR=build-gpu EXTRA=()
if [[ ${TRACE:-0} == 1 ]]; then DIR=build-trace EXTRA=(-DSYMTP_KERNEL_TRACE=ON -DSYMTP_BUILD_TESTS=OFF); fi
cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
  "${EXTRA[@]}" > "$DIR.configure.log" 2>&1 || { cat "$DIR.configure.log"; exit 1; }
if [[ $# -gt 0 ]]; then
  cmake --build "$DIR" -j "$(nproc)" --target "$@"
else
  cmake --build "$DIR" -j "$(nproc)"
fi
