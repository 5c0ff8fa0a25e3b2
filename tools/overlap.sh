#!/usr/bin/env bash
# Launcher flags measured side by side (GPU), e.g. the all-reduce overlap: for
# each shape, one job per arm (default: the copy exchange off and at its
# default threshold), the arms alternating
# within each repeat, all in one build on one machine. Reports the GPU forward
# time per step (CUDA events; median over the measured steps, then over the
# repeats), each arm against the first, and with --noar the share of the
# all-reduce time an arm hides:
#   hidden = 1 - (t_arm - t_arm,noAR) / (t_first - t_first,noAR)
# (t_noAR: the same run with --bench-skip-allreduce, TP > 1 only).
# Shapes: decodeB@C (steady decode, batch B, context C), prefillN (one
# N-token prompt per step), mixed (chunked prefill of 1024-token prompts
# beside decode rows, 32 running).
#   tools/overlap.sh [--tp 2] [--model llama-8b-shape] [--overrides layers=32]
#       [--shapes "decode32@1024 decode256@1024 prefill4096 mixed"] [--repeats 2]
#       [--arms "off=--exchange-min-rows=0 on=--exchange-min-rows=1024"]
#       [--noar] [--out DIR]   (an arm is NAME=FLAGS, FLAGS comma-separated)
#       [-- more launcher flags for every run]
# Uses $SYMTP_BIN when set (the device run script), else tools/launch.sh;
# $SYMTP_BIN_<arm> runs that arm with another build (tools/device/ab_bench.sh).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TP=2 MODEL=llama-8b-shape OVERRIDES=layers=32 OUT=out/overlap REPEATS=2 NOAR=0
SHAPES="decode32@1024 decode64@1024 decode128@1024 decode256@1024 decode512@1024 prefill512 prefill4096 mixed"
ARMS="off=--exchange-min-rows=0 on="
EXTRA=()
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --tp) TP=$2; shift 2;; --model) MODEL=$2; shift 2;; --overrides) OVERRIDES=$2; shift 2;;
    --shapes) SHAPES=$2; shift 2;; --repeats) REPEATS=$2; shift 2;; --arms) ARMS=$2; shift 2;;
    --noar) NOAR=1; shift;; --out) OUT=$2; shift 2;;
    -h|--help) usage; exit 0;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "overlap.sh: unknown argument $1 (--help)" >&2; exit 2;;
  esac
done
source "$ROOT/tools/lib/launch.sh"
# An arm's own binary (SYMTP_BIN_<arm>) where given.
run() {
  local arm_bin=SYMTP_BIN_$1
  shift
  symtp_launch "${!arm_bin:-${SYMTP_BIN:-}}" "$@"
}
mkdir -p "$OUT"
read -ra arm_list <<<"$ARMS"
skips=(false)
[[ $NOAR == 1 && $TP -gt 1 ]] && skips=(false true)
failed=0
for shape in $SHAPES; do
  ov=$OVERRIDES
  case $shape in
    prefill*) n=${shape#prefill}
      wl=(--num-requests=6 --concurrency=1 --max-batch=1 --prompt-len=$n --output-len=1
          --max-batched-tokens=$n --prefill-chunk=$n --warmup-steps=2)
      # The models' default max_seq_len (4096) has no room for a 4096-token
      # prompt and its token.
      ((n >= 4096)) && ov="${ov:+$ov,}max_seq_len=$((n + 16))" ;;
    decode*) b=${shape#decode}; ctx=${b#*@}; b=${b%@*}
      wl=(--steady-batch=$b --max-batch=$b --steady-context=$ctx --steady-steps=30 --warmup-steps=5
          --max-batched-tokens=8192 --prefill-chunk=8192) ;;
    mixed)
      wl=(--num-requests=64 --concurrency=32 --max-batch=32 --prompt-len=1024 --output-len=24
          --max-batched-tokens=1024 --prefill-chunk=512 --warmup-steps=8) ;;
    *) echo "overlap.sh: unknown shape $shape" >&2; exit 2;;
  esac
  for ((r = 0; r < REPEATS; ++r)); do
    mapfile -t order < <(symtp_arm_order "$r" "${arm_list[@]}")
    for arm in "${order[@]}"; do
      name=${arm%%=*} flags=${arm#*=}; flags=${flags//,/ }
      for skip in "${skips[@]}"; do
        dir=$OUT/${shape}__${name}__skip${skip}__r$r
        echo "overlap: $shape arm=$name skip_allreduce=$skip repeat=$r" >&2
        # shellcheck disable=SC2086
        run "$name" --backend=cuda --tp="$TP" --model="$MODEL" --model-overrides="$ov" $flags \
          --bench-skip-allreduce=$skip --progress=false --out="$dir" "${wl[@]}" "${EXTRA[@]}" \
          >"$dir.out" 2>"$dir.log" || { echo "overlap: FAILED, see $dir.log" >&2; tail -3 "$dir.log" >&2; failed=1; }
        rm -f "$dir/tokens.jsonl" "$dir/prompts.jsonl"
      done
    done
  done
done
python3 - "$OUT" "$TP" "$MODEL" "$OVERRIDES" "$ARMS" <<'PY'
import json, os, statistics, sys
out, tp, model, ov, arms = sys.argv[1:6]
arms = [(a.split("=", 1)[0], a.split("=", 1)[1].replace(",", " ")) for a in arms.split()]
eager = []  # runs whose measured decode steps did not all replay a graph: (run, eager, decode)
def t(shape, arm, skip):
    vals = []
    for d in sorted(os.listdir(out)):
        if not d.startswith(f"{shape}__{arm}__skip{skip}__r"): continue
        p = os.path.join(out, d, "summary.json")
        if not os.path.isfile(p): continue
        st = json.load(open(p))["steps"]
        # Builds that report it (cuda): decode steps that did not replay a graph.
        if shape.startswith("decode") and "decode_from_graphs" in st and \
                st["decode_from_graphs"] < st["decode"]:
            eager.append((d, st["decode"] - st["decode_from_graphs"], st["decode"]))
        key = ("prefill_forward_us" if shape.startswith("prefill")
               else "decode_forward_us" if shape.startswith("decode") else "device_forward_us")
        v = (st.get(key) or {}).get("p50")
        if v: vals.append(v / 1e3)
    return (statistics.median(vals), vals) if vals else (None, [])
shapes = []
for d in sorted(os.listdir(out)):
    if "__" in d and not d.endswith(".log"):
        s = d.split("__")[0]
        if s not in shapes: shapes.append(s)
base = arms[0][0]
head = "| shape | " + " | ".join(f"{a} (ms)" for a, _ in arms) + " | " + \
       " | ".join(f"{a} / {base}" for a, _ in arms[1:]) + " | AR hidden |"
rows = [head, "|" + "---|" * (head.count("|") - 1)]
res = {}
for s in shapes:
    ts = {a: t(s, a, "false") for a, _ in arms}
    nr = {a: t(s, a, "true")[0] for a, _ in arms}
    r = {a: dict(ms=ts[a][0], runs=ts[a][1], noar_ms=nr[a]) for a, _ in arms}
    cells = [f"{ts[a][0]:.3f}" if ts[a][0] else "-" for a, _ in arms]
    ratios, hid = [], []
    for a, _ in arms[1:]:
        if ts[a][0] and ts[base][0]:
            r[a]["ratio"] = ts[a][0] / ts[base][0]
            ratios.append(f"{r[a]['ratio']:.3f}")
        else:
            ratios.append("-")
        if None not in (ts[a][0], nr[a], ts[base][0], nr[base]) and ts[base][0] > nr[base]:
            r[a]["ar_hidden"] = 1 - (ts[a][0] - nr[a]) / (ts[base][0] - nr[base])
            hid.append(f"{a}: {100 * r[a]['ar_hidden']:.0f}%")
    rows.append(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " | " +
                (", ".join(hid) or "-") + " |")
    res[s] = r
md = (f"# Side by side: {model} ({ov}), TP={tp}\n\n"
      f"GPU forward time per step (CUDA events), median over the measured steps of a run, then "
      f"over the repeats (arms alternate). Arms: " + "; ".join(f"{a} = `{f}`" for a, f in arms) +
      ".\n\n" + "\n".join(rows) + "\n")
if eager:
    md += ("\nMeasured decode steps that ran without a CUDA graph (not comparable with graph "
           "steps), by run: " + "; ".join(f"{d}: {e} of {n}" for d, e, n in eager) + ".\n")
open(os.path.join(out, "overlap.md"), "w").write(md)
json.dump(dict(model=model, overrides=ov, tp=int(tp), arms=dict(arms), shapes=res,
               eager_decode_steps=[dict(run=d, eager=e, decode=n) for d, e, n in eager]),
          open(os.path.join(out, "overlap.json"), "w"), indent=1)
print(md)
PY
exit $failed
