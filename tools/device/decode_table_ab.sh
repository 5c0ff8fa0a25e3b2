#!/usr/bin/env bash
# The runtime's steady decode (tools/decode_sweep.sh: TP=1, llama-8b-shape, graphs on,
# context 1024, 100 steps) with cuBLASLt's heuristic GEMMs and with a GEMM tuning table,
# alternated ROUNDS times per layer count, so that drift hits both alike.
#   run(kind=nvidia-h200, carry=[".deps"], command="tools/device/decode_table_ab.sh")
# Variables: TABLE (default: session 14's run-al TP=1 table), LAYERS (default "4 32"),
# BATCHES (default "256 512"), ROUNDS (default 2), TP (default 1), SWEEP_DIR (default sweep).
# Prints one line per run and writes $OUT/$SWEEP_DIR.tar.gz (each run's decode.md /
# decode.json / logs).
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=$PWD/.deps/prefix/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$PWD/out}
# Default: the shipped H200 table (configs/gemm_tuning/).
T=${TABLE:-$PWD/configs/gemm_tuning/nvidia-h200_cublaslt130100.txt}
tools/device/build.sh symtp >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
SD=${SWEEP_DIR:-sweep}
W=$OUT/$SD
mkdir -p "$W"
trap 'tar czf "$OUT/$SD.tar.gz" -C "$OUT" "$SD" && rm -rf "$W"' EXIT
for L in ${LAYERS:-4 32}; do
  for r in $(seq 1 "${ROUNDS:-2}"); do
    for t in heuristic table; do
      extra="--gemm-tuning-file=none"  # the heuristic, not the shipped table (auto)
      [[ $t == table ]] && extra="--gemm-tuning-file=$T"
      d=$W/L${L}_${t}_$r
      SYMTP_BIN=build-gpu/tools/symtp timeout 250 tools/decode_sweep.sh --models llama-8b-shape \
        --overrides "layers=$L" --tps "${TP:-1}" --graphs true --batches "${BATCHES:-256 512}" --steps 100 \
        --extra "$extra" --out "$d" >"$d.log" 2>&1
      echo "layers $L $t round $r: $(python3 -c "import json,sys; print(' '.join('batch %d %.1f us' % (x['batch'], x['forward_ms'] * 1e3) for x in json.load(open(sys.argv[1]))))" "$d/decode.json" 2>&1 | tail -1)"
    done
  done
done
echo "GEMM plans from the table in the first table run: $(cat "$W"/L*_table_1/*.log 2>/dev/null | grep -c "from the tuning table")"
