#!/usr/bin/env bash
# Sets up and runs every symtp test: installs missing packages, builds the
# default preset (CUDA code too when nvcc is present), runs all tests through
# CTest (GPU tests skip with a reason on a machine without a GPU), then builds
# the ring tests under ASan+UBSan and TSan and runs them.
#   SYMTP_SKIP_SANITIZERS=1  skip the sanitizer builds
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/lib/deps.sh
symtp_install_deps
J=$(symtp_jobs)

cmake --preset default >/dev/null
cmake --build --preset default -j "$J"
ctest --preset default -j "$J" --timeout 300

if [[ ${SYMTP_SKIP_SANITIZERS:-0} != 1 ]]; then
  # The shared-memory ring, the diff decoder (with its corruption test) and the
  # scheduler/worker state under ASan+UBSan and TSan (host code only).
  SAN_TARGETS=(common_test ipc_test protocol_test scheduler_test)
  SAN_FILTER='^(StatusMacros|Histogram|Deadline|Log|Ring|Spmc|Spsc|Shm|Segment|Liveness|PidWatch|Futex|Crc32c|Varint|Diff|Result|Corruption|BlockManager|Scheduler|WorkerState|Simulation)'
  for san in asan tsan; do
    echo "=== sanitizer build: $san ==="
    cmake --preset "$san" >/dev/null
    cmake --build --preset "$san" -j "$J" --target "${SAN_TARGETS[@]}"
    ctest --test-dir "build-$san" -j "$J" --timeout 600 -R "$SAN_FILTER" --output-on-failure
  done
fi
