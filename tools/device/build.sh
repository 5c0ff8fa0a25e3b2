#!/usr/bin/env bash
# On the device machine: configure and build (Release, sm_90) from the carried
# tree, using the Abseil/GoogleTest/benchmark staged in .deps/ by
# tools/device/stage_deps.sh. Arguments: targets to build (default: all).
# Build dir: build-gpu/ (kept between calls on a warm machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PREFIX=$PWD/.deps/prefix/usr
[[ -d $PREFIX ]] || { echo "build.sh: $PREFIX missing: run tools/device/stage_deps.sh here and carry .deps" >&2; exit 2; }
export LD_LIBRARY_PATH=$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
  > build-gpu.configure.log 2>&1 || { cat build-gpu.configure.log; exit 1; }
if [[ $# -gt 0 ]]; then
  cmake --build build-gpu -j "$(nproc)" --target "$@"
else
  cmake --build build-gpu -j "$(nproc)"
fi
