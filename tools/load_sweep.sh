#!/usr/bin/env bash
# v0 and v1 under load: the same seeded workload (random prompt and output
# lengths, Poisson arrivals) at each offered request rate, once per mode, the
# modes alternating within a rate; then load.md / load.json (tools/load_report.py):
# throughput, TTFT, TPOT and end-to-end latency percentiles, GPU idle between
# steps, and v1 against v0 at each rate.
usage() {
  cat <<'USAGE'
usage: tools/load_sweep.sh [options] [-- extra launcher flags]
  --backend cpu|cuda|auto   backend (default auto)
  --tp N                    TP degree (default 2)
  --model PRESET            model preset (default tiny)
  --overrides "layers=4"    model overrides
  --rates "8 16 32 0"       offered Poisson arrival rates, requests/s
                            (0: closed loop, --max-batch requests in flight)
  --requests N              requests per run (default 200)
  --prompt-len DIST         prompt lengths (default uniform:128:1024)
  --output-len DIST         output lengths (default uniform:64:256)
  --max-batch N             most sequences in a step (default 256)
  --modes "v0 v1"           modes, in the order they run at each rate
  --seed N                  workload seed, the same for every run (default 1)
  --check                   fail if a run fails or leaves a request unfinished
  --out DIR                 output folder (default out/load)
  -h, --help                this text
DIST is N, uniform:LO:HI or lognormal:MU:SIGMA (launcher syntax). SYMTP_BIN
overrides the symtp binary (default: the build tools/launch.sh finds).
USAGE
}
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BACKEND=auto TP=2 MODEL=tiny OVERRIDES="" RATES="8 16 32 0" REQUESTS=200
PROMPT=uniform:128:1024 OUTPUT=uniform:64:256 MAX_BATCH=256 MODES="v0 v1" SEED=1
OUT=out/load EXTRA=() CHECK=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0;;
    --backend) BACKEND=$2; shift 2;; --tp) TP=$2; shift 2;; --model) MODEL=$2; shift 2;;
    --overrides) OVERRIDES=$2; shift 2;; --rates) RATES=$2; shift 2;;
    --requests) REQUESTS=$2; shift 2;; --prompt-len) PROMPT=$2; shift 2;;
    --output-len) OUTPUT=$2; shift 2;; --max-batch) MAX_BATCH=$2; shift 2;;
    --modes) MODES=$2; shift 2;; --seed) SEED=$2; shift 2;; --out) OUT=$2; shift 2;;
    --check) CHECK=(--check); shift;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "load_sweep.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
source "$ROOT/tools/lib/launch.sh"
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs"
failed=0
for rate in $RATES; do
  for mode in $MODES; do
    dir=$OUT/runs/${mode}_r${rate}
    echo "load: $mode rate=$rate" >&2
    if ! symtp_run --backend="$BACKEND" --mode="$mode" --tp="$TP" --model="$MODEL" \
        --model-overrides="$OVERRIDES" --num-requests="$REQUESTS" --arrival-rate="$rate" \
        --prompt-len="$PROMPT" --output-len="$OUTPUT" --max-batch="$MAX_BATCH" --seed="$SEED" \
        --progress=false --out="$dir" "${EXTRA[@]}" >"$dir.log" 2>&1; then
      echo "load: run $mode rate=$rate FAILED (see $dir.log)" >&2
      tail -3 "$dir.log" >&2
      failed=1
    fi
  done
done
python3 "$ROOT/tools/load_report.py" --runs "$OUT/runs" --out "$OUT" --model "$MODEL" \
  --overrides "$OVERRIDES" "${CHECK[@]}" || failed=1
exit $failed
