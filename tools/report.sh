#!/usr/bin/env bash
# v0-vs-v1 iteration-time report: steady decode at each batch size x TP degree
# x {v0, v1} on one model, then report.md (tables shaped like the seed
# article's) and PNG plots.
usage() {
  cat <<'USAGE'
usage: tools/report.sh [options] [-- extra launcher flags]
  --backend cpu|cuda|auto   backend (default auto)
  --tps "1 2"               TP degrees
  --batches "1 8 32 128 256 512"  steady decode batch sizes
  --model PRESET            model preset (default tiny)
  --overrides "layers=4"    model overrides
  --context N               steady decode context length (default 1024)
  --steps N                 measured steps per run (default 50)
  --warmup N                warm-up steps per run (default 5)
  --machine NAME            machine name for the titles (default: the runs' devices)
  --check                   fail if a v1 cell's iteration is below its forward time
                            or above twice it
  --out DIR                 output folder (default out/report)
  -h, --help                this text
Iteration time is the step period over the measured steps (their number over
the time between the first and the last completion). SYMTP_BIN overrides the
symtp binary (default: the build tools/launch.sh finds).
USAGE
}
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BACKEND=auto TPS="1 2" BATCHES="1 8 32 128 256 512" MODEL=tiny OVERRIDES="" CONTEXT=1024 STEPS=50
WARMUP=5 OUT=out/report EXTRA=() MACHINE="" CHECK=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0;;
    --backend) BACKEND=$2; shift 2;; --tps) TPS=$2; shift 2;; --batches) BATCHES=$2; shift 2;;
    --model) MODEL=$2; shift 2;; --overrides) OVERRIDES=$2; shift 2;; --context) CONTEXT=$2; shift 2;;
    --steps) STEPS=$2; shift 2;; --warmup) WARMUP=$2; shift 2;; --out) OUT=$2; shift 2;;
    --machine) MACHINE=$2; shift 2;; --check) CHECK=(--check); shift;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "report.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
source "$ROOT/tools/lib/launch.sh"
mkdir -p "$OUT/runs"
failed=0
for tp in $TPS; do
  for b in $BATCHES; do
    for mode in v0 v1; do
      dir=$OUT/runs/${mode}_tp${tp}_b${b}
      echo "report: $mode tp=$tp batch=$b" >&2
      if ! symtp_run --backend="$BACKEND" --mode=$mode --tp=$tp --model="$MODEL" --model-overrides="$OVERRIDES" \
          --steady-batch=$b --max-batch=$b --steady-context=$CONTEXT --steady-steps=$STEPS \
          --warmup-steps=$WARMUP --max-batched-tokens=$(( b > 2048 ? b : 2048 )) \
          --prefill-chunk=2048 --progress=false --out="$dir" "${EXTRA[@]}" >"$dir.log" 2>&1; then
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
  --overrides "$OVERRIDES" --machine "$MACHINE" "${CHECK[@]}" || failed=1
echo "report: $OUT/report.md" >&2
exit $failed
