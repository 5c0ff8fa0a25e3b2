#!/usr/bin/env bash
# Side-by-side kernels_bench of a base commit and the working tree, in one
# device run: both are built, then run in alternation (base, new, base,
# new, ...) so that clock and thermal drift fall on both alike; the table
# compares medians over the rounds.
#   here:   tools/device/ab_bench.sh --prepare <commit>   # writes .ab/base.tar
#   device: run(carry=[".deps", ".ab"], command="tools/device/ab_bench.sh")
# AB_ARGS: kernels_bench arguments both builds understand (default
# "--sections model"); ROUNDS: runs of each (default 3). Writes $OUT/ab/
# (each run's output and JSON, as ab.tar.gz) and $OUT/ab_summary.md.
# AB_MODE=step times whole symtp jobs instead: tools/overlap.sh with the arms
# base (the base build) and new (this tree), plus $AB_ARMS of this tree
# (e.g. "nofuse=--fuse-allreduce-norm=false"); AB_TP, AB_MODEL, AB_OVERRIDES,
# AB_SHAPES shape them (default TP 2, llama-8b-shape 32 layers, decode 1-512
# at context 1024); ROUNDS is the repeats.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [[ ${1:-} == --prepare ]]; then
  [[ -n ${2:-} ]] || { echo "usage: $0 --prepare <commit>" >&2; exit 2; }
  mkdir -p .ab
  git archive --format=tar "$2" >.ab/base.tar
  git rev-parse "$2" >.ab/base.commit
  echo "base $(cat .ab/base.commit) in .ab/base.tar; carry .ab and .deps"
  exit 0
fi
[[ -f .ab/base.tar ]] || { echo "ab_bench.sh: no .ab/base.tar: run --prepare here and carry .ab" >&2; exit 2; }
source tools/device/device_env.sh
mkdir -p "$OUT/ab"
rm -rf .ab/base && mkdir -p .ab/base && tar xf .ab/base.tar -C .ab/base
ln -sfn "$PWD/.deps" .ab/base/.deps
TARGET=kernels_bench
[[ ${AB_MODE:-} == step ]] && TARGET=symtp
(.ab/base/tools/device/build.sh $TARGET >"$OUT/ab/build_base.log" 2>&1) || { tail -30 "$OUT/ab/build_base.log"; exit 1; }
(tools/device/build.sh $TARGET >"$OUT/ab/build_new.log" 2>&1) || { tail -30 "$OUT/ab/build_new.log"; exit 1; }
if [[ ${AB_MODE:-} == step ]]; then
  SYMTP_BIN_base=$PWD/.ab/base/build-gpu/tools/symtp SYMTP_BIN=$PWD/build-gpu/tools/symtp \
    tools/overlap.sh --tp "${AB_TP:-2}" --model "${AB_MODEL:-llama-8b-shape}" \
    --overrides "${AB_OVERRIDES:-layers=32}" --repeats "${ROUNDS:-3}" --out "$OUT/ab/step" \
    --shapes "${AB_SHAPES:-decode1@1024 decode8@1024 decode32@1024 decode64@1024 decode256@1024 decode512@1024}" \
    --arms "base= new= ${AB_ARMS:-}" 2>"$OUT/ab/step.log" >"$OUT/ab_summary.md"
  rc=$?
  echo "base $(cat .ab/base.commit)" >>"$OUT/ab_summary.md"
  cat "$OUT/ab_summary.md"; tail -5 "$OUT/ab/step.log"
  (cd "$OUT" && tar czf ab.tar.gz ab/step.log ab/step/*.md ab/step/*.json ab/step/*/summary.json 2>/dev/null; rm -rf ab)
  exit $rc
fi
ARGS=${AB_ARGS:-"--sections model"}
for i in $(seq 1 "${ROUNDS:-3}"); do
  for side in base new; do
    bin=build-gpu/bench/kernels/kernels_bench
    [[ $side == base ]] && bin=.ab/base/build-gpu/bench/kernels/kernels_bench
    timeout 300 "$bin" $ARGS --json "$OUT/ab/${side}_$i.json" >"$OUT/ab/${side}_$i.txt" 2>&1
    echo "round $i $side: exit $?"
  done
done
python3 - "$OUT/ab" "$(cat .ab/base.commit 2>/dev/null || echo base)" "$ARGS" >"$OUT/ab_summary.md" <<'PY'
import glob, json, os, statistics, sys
d, base_commit, args = sys.argv[1:4]
def load(side):
    runs = []
    for f in sorted(glob.glob(os.path.join(d, side + "_*.json"))):
        try:
            runs.append(json.load(open(f)))
        except Exception as e:
            print("unreadable %s: %s" % (f, e))
    return runs
base, new = load("base"), load("new")
print("# kernels_bench %s: base %s vs working tree, %d / %d rounds alternated\n" %
      (args, base_commit[:12], len(base), len(new)))
def model_rows(runs):
    out = {}
    for r in runs:
        for m in r.get("model_decode", []):
            k = (m["attention_decode_kernel"], m["cuda_graphs"], m["batch"])
            out.setdefault(k, []).append(m["step_us_gpu"])
    return out
b, n = model_rows(base), model_rows(new)
if b or n:
    print("GpuModel decode step (us, GPU time per step; median over rounds):\n")
    print("| decode attention | graphs | batch | base | new | change |")
    print("|---|---|---|---|---|---|")
    for k in sorted(set(b) | set(n), key=lambda k: (k[0], not k[1], k[2])):
        bm = statistics.median(b[k]) if k in b else float("nan")
        nm = statistics.median(n[k]) if k in n else float("nan")
        print("| %s | %s | %d | %.1f | %.1f | %+.1f%% |" % (k[0], "on" if k[1] else "off", k[2], bm, nm,
                                                         100.0 * (nm - bm) / bm))
PY
cat "$OUT/ab_summary.md"
# One archive (the device returns a limited number of files).
(cd "$OUT" && tar czf ab.tar.gz ab && rm -rf ab)
