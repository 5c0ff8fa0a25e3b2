#!/usr/bin/env bash
# Stages what the GPU (device) machine lacks into .deps/ (git-ignored), to be
# carried with the working tree: Debian 12's Abseil, GoogleTest and Google
# Benchmark (headers, libraries and CMake configs), unpacked as a prefix.
# Debian 12 (glibc 2.36, g++ 12) binaries run on the device's Ubuntu 24.04.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEPS=.deps
if [[ -f $DEPS/.staged ]]; then echo "stage_deps: $DEPS already staged"; exit 0; fi
rm -rf "$DEPS" && mkdir -p "$DEPS/debs" "$DEPS/prefix"
(cd "$DEPS/debs" && apt-get download libabsl-dev libabsl20220623 libgtest-dev libgmock-dev \
   libbenchmark-dev libbenchmark1debian >/dev/null)
for f in "$DEPS"/debs/*.deb; do dpkg -x "$f" "$DEPS/prefix"; done
rm -rf "$DEPS/debs" "$DEPS/prefix/usr/share/doc"
touch "$DEPS/.staged"
du -sh "$DEPS"
