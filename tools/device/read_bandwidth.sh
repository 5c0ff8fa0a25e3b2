#!/usr/bin/env bash
# Read-only and copy bandwidth of this GPU, whole and per launch at weight-GEMM
# sizes (tools/device/read_bandwidth.cu). Writes $OUT/read_bandwidth.json.
#   run(kind=nvidia-h200, command="tools/device/read_bandwidth.sh")
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/device/device_env.sh >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvcc -O3 -arch=sm_90a -o "$tmp/read_bandwidth" tools/device/read_bandwidth.cu
"$tmp/read_bandwidth" | tee "$OUT/read_bandwidth.json"
