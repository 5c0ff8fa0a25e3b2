#!/usr/bin/env bash
# Sets up and runs every symtp test: installs missing packages, builds the
# default preset (CUDA code too when nvcc is present), runs all tests through
# CTest (GPU tests skip with a reason on a machine without a GPU), then builds
# the ring tests under ASan+UBSan and TSan and runs them; runs the protocol
# decoders' fuzz target under libFuzzer when clang is installed.
#   SYMTP_SKIP_SANITIZERS=1  skip the sanitizer builds
#   SYMTP_FUZZ_SECONDS=N     libFuzzer's time budget (default 120; 0 skips it)
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/lib/deps.sh
symtp_install_deps
J=$(symtp_jobs)

cmake --preset default >/dev/null
cmake --build --preset default -j "$J"
ctest --preset default -j "$J" --timeout 300

# The diff and result decoders' fuzz target (protocol/fuzz/diff_fuzzer.cc):
# CTest above replayed the committed seed corpus through it (built with the
# default compiler); where clang with libFuzzer is installed it also runs
# under libFuzzer + ASan/UBSan for a bounded time from those seeds. A crash
# fails the run (libFuzzer exits non-zero and leaves crash-* here).
#   SYMTP_FUZZ_SECONDS=120  libFuzzer's time budget (0: skip it)
FUZZ_SECONDS=${SYMTP_FUZZ_SECONDS:-120}
if [[ $FUZZ_SECONDS != 0 ]] && command -v clang++ >/dev/null; then
  echo "=== libFuzzer: protocol decoders, ${FUZZ_SECONDS} s ==="
  cmake --preset fuzz >/dev/null
  if cmake --build --preset fuzz --target diff_fuzzer; then
    fuzz_dir=$(mktemp -d)
    cp tests/protocol/corpus/* "$fuzz_dir"/
    build-fuzz/protocol/diff_fuzzer -max_len=4096 -max_total_time="$FUZZ_SECONDS" \
      -print_final_stats=1 -artifact_prefix=build-fuzz/ "$fuzz_dir"
    rm -rf "$fuzz_dir"
  else
    echo "symtp: clang cannot link -fsanitize=fuzzer here; the seed corpus replay (CTest) stands in"
  fi
else
  echo "symtp: no clang++ (or SYMTP_FUZZ_SECONDS=0): the fuzz target ran over the seed corpus only (CTest)"
fi

if [[ ${SYMTP_SKIP_SANITIZERS:-0} != 1 ]]; then
  # The shared-memory ring, the diff decoder (with its corruption test) and the
  # scheduler/worker state under ASan+UBSan and TSan (host code only).
  # The flag parser, the workload stream and the fuzz target's seed corpus too.
  SAN_TARGETS=(common_test ipc_test protocol_test scheduler_test runtime_options_test diff_fuzzer_replay)
  SAN_FILTER='^(StatusMacros|Histogram|Deadline|Log|Ring|Spmc|Spsc|Shm|Segment|Liveness|PidWatch|Futex|Crc32c|Varint|Diff|Result|Corruption|BlockManager|Scheduler|WorkerState|Simulation|Options|Workload|protocol_fuzz_corpus_replay)'
  for san in asan tsan; do
    echo "=== sanitizer build: $san ==="
    cmake --preset "$san" >/dev/null
    cmake --build --preset "$san" -j "$J" --target "${SAN_TARGETS[@]}"
    ctest --test-dir "build-$san" -j "$J" --timeout 600 -R "$SAN_FILTER" --output-on-failure
  done
fi
