#!/usr/bin/env bash
# Sets up symtp on a fresh Debian/Ubuntu machine and runs the main job: a
# tensor-parallel decode workload (TP=2) through the launcher. On a machine
# without GPUs it runs the CPU backend; with GPUs, the CUDA backend.
# Extra arguments go to the launcher (tools/launch.sh --help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/lib/deps.sh
symtp_install_deps
cmake --preset release >/dev/null
cmake --build --preset release -j "$(symtp_jobs)" --target symtp
OUT=${OUT_DIR:-out/quickstart}
mkdir -p "$OUT"
SYMTP_BUILD_DIR=$PWD/build-release ./tools/launch.sh --tp 2 --model tiny --num-requests 64 \
  --prompt-len uniform:16:96 --output-len 32 --max-batch 32 --out "$OUT" "$@"
echo "quickstart: results above; files in $OUT: summary.json, requests.jsonl, tokens.jsonl (docs/OUTPUTS.md)"
