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
# AB_MODE=variants times this tree (arm "new") against variants of a few of
# its files, all built in this one tree and build directory: while variant V
# builds, each file .ab/variants/V/<path> replaces <path> (put back after), and
# its symtp is kept as arm V. Shapes and repeats as for AB_MODE=step; AB_TESTS,
# a gtest filter, runs on each build's AB_TEST_BIN (default kernels_test;
# e.g. allreduce_test) first: a variant that fails is not timed, and nothing
# is if the tree fails;
# AB_VARIANTS names the variants to build (default: all).
# No base commit is needed.
#   here:   tools/device/ab_bench.sh --variant V <commit>   # .ab/variants/V/: the
#           files <commit> changed since its merge base with HEAD, as it has them
#   device: run(carry=[".deps", ".ab"], command="AB_MODE=variants tools/device/ab_bench.sh")
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
if [[ ${1:-} == --variant ]]; then
  [[ ${2:-} =~ ^[A-Za-z0-9_]+$ && -n ${3:-} ]] || { echo "usage: $0 --variant NAME <commit> (NAME: letters, digits, _)" >&2; exit 2; }
  dir=.ab/variants/$2 base=$(git merge-base HEAD "$3") || exit 2
  rm -rf "$dir" && mkdir -p "$dir"
  # The variant's own changes (since it left HEAD's history), on files HEAD
  # has not changed since: anything else would undo HEAD's work.
  git diff --name-status "$base" "$3" | while read -r st f; do
    [[ $st == M ]] || { echo "ab_bench.sh: $f is ${st} in $3 (a variant only replaces files)" >&2; exit 1; }
    git diff --quiet "$base" HEAD -- "$f" ||
      { echo "ab_bench.sh: $f changed in HEAD since $3 left it: rebase $3" >&2; exit 1; }
    mkdir -p "$dir/$(dirname "$f")" && git show "$3:$f" >"$dir/$f"
  done || { rm -rf "$dir"; exit 1; }
  echo "variant $2: $(cd "$dir" && find . -type f | sed 's|^\./||' | tr '\n' ' ')(carry .ab and .deps)"
  exit 0
fi
if [[ ${AB_MODE:-} == variants ]]; then
  [[ -d .ab/variants ]] || { echo "ab_bench.sh: no .ab/variants: run --variant here and carry .ab" >&2; exit 2; }
  source tools/device/device_env.sh
  mkdir -p "$OUT/ab" build-variants
  targets=(symtp) arms="new="
  test_bin=${AB_TEST_BIN:-kernels_test}
  [[ -n ${AB_TESTS:-} ]] && targets+=("$test_bin")
  # Runs AB_TESTS on the build just made (arm $1); fails where none ran.
  check() {
    [[ -n ${AB_TESTS:-} ]] || return 0
    "build-gpu/tests/${test_bin%_test}/$test_bin" --gtest_filter="$AB_TESTS" >"$OUT/ab/tests_$1.log" 2>&1
    local rc=$?
    # A filter that matches nothing passes: that is no check.
    grep -qE '^\[  PASSED  \] [1-9]' "$OUT/ab/tests_$1.log" || rc=1
    echo "$1 tests: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/ab/tests_$1.log" | tr '\n' ' ')"
    return $rc
  }
  # The tree arrives with its own modification times, which can be older than
  # objects a variant left in build-gpu/ on a warm machine: the files any
  # variant replaces are touched before the tree's build, or it would keep the
  # variant's objects. Within a call, cp gives the swapped and restored files
  # fresh times.
  touch_replaced() { (cd .ab/variants && find . -mindepth 2 -type f | cut -d/ -f3- | sort -u) |
    while read -r f; do [[ -f $f ]] && touch "$f"; done; }
  touch_replaced
  (tools/device/build.sh "${targets[@]}" >"$OUT/ab/build_new.log" 2>&1) || { tail -30 "$OUT/ab/build_new.log"; exit 1; }
  check new || { echo "the tree's tests failed: nothing timed"; exit 1; }
  mkdir -p build-variants/new && cp build-gpu/tools/symtp build-variants/new/
  for vdir in .ab/variants/*/; do
    v=$(basename "$vdir")
    [[ -z ${AB_VARIANTS:-} || " $AB_VARIANTS " == *" $v "* ]] || continue
    mapfile -t files < <(cd "$vdir" && find . -type f | sed 's|^\./||')
    rm -rf .ab/orig && mkdir -p .ab/orig
    for f in "${files[@]}"; do
      mkdir -p ".ab/orig/$(dirname "$f")" && cp "$f" ".ab/orig/$f" && cp "$vdir/$f" "$f"
    done
    tools/device/build.sh "${targets[@]}" >"$OUT/ab/build_$v.log" 2>&1
    built=$?
    ok=$built
    [[ $built == 0 ]] && { check "$v"; ok=$?; }
    for f in "${files[@]}"; do cp ".ab/orig/$f" "$f"; done
    if [[ $built != 0 ]]; then echo "variant $v: build failed"; tail -20 "$OUT/ab/build_$v.log"; continue; fi
    [[ $ok == 0 ]] || { echo "variant $v: tests failed, not timed"; continue; }
    mkdir -p "build-variants/$v" && cp build-gpu/tools/symtp "build-variants/$v/"
    export "SYMTP_BIN_$v=$PWD/build-variants/$v/symtp"
    arms+=" $v="
  done
  SYMTP_BIN=$PWD/build-variants/new/symtp \
    tools/overlap.sh --tp "${AB_TP:-2}" --model "${AB_MODEL:-llama-8b-shape}" \
    --overrides "${AB_OVERRIDES:-layers=32}" --repeats "${ROUNDS:-3}" --out "$OUT/ab/step" \
    --shapes "${AB_SHAPES:-decode1@1024 decode8@1024 decode32@1024 decode64@1024 decode256@1024 decode512@1024}" \
    --arms "$arms" 2>"$OUT/ab/step.log" >"$OUT/ab_summary.md"
  rc=$?
  cat "$OUT/ab_summary.md"; tail -5 "$OUT/ab/step.log"
  (cd "$OUT" && tar czf ab.tar.gz ab/*.log ab/step/*.md ab/step/*.json ab/step/*/summary.json 2>/dev/null; rm -rf ab)
  exit $rc
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
