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
  for san in asan tsan; do
    echo "=== ring tests under $san ==="
    cmake --preset "$san" >/dev/null
    if cmake --build --preset "$san" -j "$J" --target help | grep -q '^ipc_test'; then
      cmake --build --preset "$san" -j "$J" --target ipc_test common_test
      ctest --test-dir "build-$san" -j "$J" --timeout 300 -R '^(Ring|Spmc|Spsc|Shm|Segment|Liveness|Futex|Common|StatusMacros|Histogram|Deadline|Log)' --output-on-failure
    else
      cmake --build --preset "$san" -j "$J" --target common_test
      ctest --test-dir "build-$san" --timeout 300 -R '^(StatusMacros|Histogram|Deadline|Log)' --output-on-failure
    fi
  done
fi
