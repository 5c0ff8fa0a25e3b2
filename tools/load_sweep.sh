#!/usr/bin/env bash
# Arms under load (by default v0 and v1): the same seeded workload (random
# prompt and output lengths, Poisson arrivals) at each offered request rate,
# once per arm and repeat, the arms alternating within a rate (their order
# reversed on odd repeats); then load.md / load.json (tools/load_report.py):
# throughput, TTFT, TPOT, ITL and end-to-end latency percentiles, GPU idle
# between steps, and each arm against the first at each rate.
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
  --arms "v0=--mode=v0 v1=--mode=v1"
                            arms, NAME=FLAGS (FLAGS comma-separated, may be
                            empty), in the order they run; the first is the
                            baseline the others are compared with
  --repeats N               runs per arm and rate (default 1)
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
PROMPT=uniform:128:1024 OUTPUT=uniform:64:256 MAX_BATCH=256 ARMS="v0=--mode=v0 v1=--mode=v1"
SEED=1 REPEATS=1
OUT=out/load EXTRA=() CHECK=()
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) usage; exit 0;;
    --backend) BACKEND=$2; shift 2;; --tp) TP=$2; shift 2;; --model) MODEL=$2; shift 2;;
    --overrides) OVERRIDES=$2; shift 2;; --rates) RATES=$2; shift 2;;
    --requests) REQUESTS=$2; shift 2;; --prompt-len) PROMPT=$2; shift 2;;
    --output-len) OUTPUT=$2; shift 2;; --max-batch) MAX_BATCH=$2; shift 2;;
    --arms) ARMS=$2; shift 2;; --repeats) REPEATS=$2; shift 2;;
    --seed) SEED=$2; shift 2;; --out) OUT=$2; shift 2;;
    --check) CHECK=(--check); shift;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "load_sweep.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
source "$ROOT/tools/lib/launch.sh"
read -ra arm_list <<<"$ARMS"
names=()
for arm in "${arm_list[@]}"; do
  name=${arm%%=*}
  [[ $arm == *=* && $name =~ ^[A-Za-z0-9.-]+$ ]] || {
    echo "load_sweep.sh: an arm is NAME=FLAGS with NAME of letters, digits, . and -: $arm" >&2; exit 2; }
  names+=("$name")
done
rm -rf "$OUT/runs"
mkdir -p "$OUT/runs"
failed=0
for rate in $RATES; do
  for ((k = 0; k < REPEATS; ++k)); do
    mapfile -t order < <(symtp_arm_order "$k" "${arm_list[@]}")
    for arm in "${order[@]}"; do
      name=${arm%%=*} flags=${arm#*=}; flags=${flags//,/ }
      dir=$OUT/runs/${name}_r${rate}_k$k
      echo "load: $name rate=$rate repeat=$k" >&2
      # shellcheck disable=SC2086
      if ! symtp_run --backend="$BACKEND" --tp="$TP" --model="$MODEL" \
          --model-overrides="$OVERRIDES" --num-requests="$REQUESTS" --arrival-rate="$rate" \
          --prompt-len="$PROMPT" --output-len="$OUTPUT" --max-batch="$MAX_BATCH" --seed="$SEED" \
          --progress=false --out="$dir" $flags "${EXTRA[@]}" >"$dir.log" 2>&1; then
        echo "load: run $name rate=$rate repeat=$k FAILED (see $dir.log)" >&2
        tail -3 "$dir.log" >&2
        failed=1
      fi
    done
  done
done
python3 "$ROOT/tools/load_report.py" --runs "$OUT/runs" --out "$OUT" --model "$MODEL" \
  --overrides "$OVERRIDES" --arms "${names[*]}" "${CHECK[@]}" || failed=1
exit $failed
