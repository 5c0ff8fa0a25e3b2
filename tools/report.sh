#!/usr/bin/env bash
# v0-vs-v1 iteration-time report: steady decode at each batch size x TP degree
# x {v0, v1} on one model, then report.md (tables shaped like the seed
# article's) and PNG plots.
#   tools/report.sh [--backend cpu|cuda] [--tps "1 2"] [--batches "32 128 256 512"]
#                   [--model PRESET] [--overrides "layers=4"] [--context 1024]
#                   [--steps 50] [--warmup 5] [--out DIR] [-- extra launcher flags]
# SYMTP_BIN overrides the symtp binary (default: the build tools/launch.sh finds).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BACKEND=auto TPS="1 2" BATCHES="32 128 256 512" MODEL=tiny OVERRIDES="" CONTEXT=1024 STEPS=50
WARMUP=5 OUT=out/report EXTRA=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --backend) BACKEND=$2; shift 2;; --tps) TPS=$2; shift 2;; --batches) BATCHES=$2; shift 2;;
    --model) MODEL=$2; shift 2;; --overrides) OVERRIDES=$2; shift 2;; --context) CONTEXT=$2; shift 2;;
    --steps) STEPS=$2; shift 2;; --warmup) WARMUP=$2; shift 2;; --out) OUT=$2; shift 2;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "report.sh: unknown argument $1" >&2; exit 2;;
  esac
done
run() { if [[ -n ${SYMTP_BIN:-} ]]; then "$SYMTP_BIN" launch "$@"; else "$ROOT/tools/launch.sh" "$@"; fi; }
mkdir -p "$OUT/runs"
failed=0
for tp in $TPS; do
  for b in $BATCHES; do
    for mode in v0 v1; do
      dir=$OUT/runs/${mode}_tp${tp}_b${b}
      echo "report: $mode tp=$tp batch=$b" >&2
      if ! run --backend="$BACKEND" --mode=$mode --tp=$tp --model="$MODEL" --model-overrides="$OVERRIDES" \
          --steady-batch=$b --max-batch=$b --steady-context=$CONTEXT --steady-steps=$STEPS \
          --warmup-steps=$WARMUP --max-batched-tokens=$(( b > 2048 ? b : 2048 )) \
          --prefill-chunk=2048 --progress=false --out="$dir" "${EXTRA[@]}" 2>"$dir.log"; then
        echo "report: run $mode tp=$tp batch=$b FAILED (see $dir.log)" >&2
        tail -3 "$dir.log" >&2
        failed=1
      fi
    done
  done
done
PY=python3
$PY -c 'import matplotlib' 2>/dev/null || { [[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3; }
$PY "$ROOT/tools/report.py" --runs "$OUT/runs" --out "$OUT" --context "$CONTEXT" --model "$MODEL" \
  --overrides "$OVERRIDES" || failed=1
echo "report: $OUT/report.md" >&2
exit $failed
