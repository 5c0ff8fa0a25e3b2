#!/usr/bin/env bash
# Measured all-reduce overlap of the bucketed row-parallel layers (GPU, TP>1):
# for each shape, the forward time with K buckets with the all-reduce (t_K)
# and with it skipped (t_K,noAR; --bench-skip-allreduce), and the same at
# K = 1:  hidden = 1 - (t_K - t_K,noAR) / (t_1 - t_1,noAR).
# Shapes: prefill of 512 and 4096 tokens, decode of 16, 64 and 256 tokens.
#   tools/overlap.sh [--tp 2] [--k 4] [--model llama-70b-shape] [--overrides layers=4] [--out DIR]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TP=2 K=4 MODEL=llama-70b-shape OVERRIDES=layers=4 OUT=out/overlap EXTRA=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --tp) TP=$2; shift 2;; --k) K=$2; shift 2;; --model) MODEL=$2; shift 2;;
    --overrides) OVERRIDES=$2; shift 2;; --out) OUT=$2; shift 2;;
    --) shift; EXTRA=("$@"); break;;
    *) echo "overlap.sh: unknown argument $1" >&2; exit 2;;
  esac
done
run() { if [[ -n ${SYMTP_BIN:-} ]]; then "$SYMTP_BIN" launch "$@"; else "$ROOT/tools/launch.sh" "$@"; fi; }
mkdir -p "$OUT"
for shape in prefill512 prefill4096 decode16 decode64 decode256; do
  case $shape in
    prefill*) n=${shape#prefill}
      wl=(--num-requests=6 --concurrency=1 --max-batch=1 --prompt-len=$n --output-len=1
          --max-batched-tokens=$n --prefill-chunk=$n --warmup-steps=2 --cuda-graphs=false) ;;
    decode*) b=${shape#decode}
      wl=(--steady-batch=$b --max-batch=$b --steady-context=512 --steady-steps=30 --warmup-steps=5
          --max-batched-tokens=4096 --prefill-chunk=4096) ;;
  esac
  for k in 1 $K; do
    for skip in false true; do
      dir=$OUT/${shape}_k${k}_skip${skip}
      echo "overlap: $shape K=$k skip_allreduce=$skip" >&2
      run --backend=cuda --tp=$TP --model="$MODEL" --model-overrides="$OVERRIDES" --buckets=$k \
        --bench-skip-allreduce=$skip --progress=false --out="$dir" "${wl[@]}" "${EXTRA[@]}" \
        2>"$dir.log" || { echo "overlap: run failed: $dir.log" >&2; tail -3 "$dir.log" >&2; }
    done
  done
done
python3 - "$OUT" "$K" <<'PY'
import json, os, sys
out, K = sys.argv[1], sys.argv[2]
def t(shape, k, skip):
    p = os.path.join(out, f"{shape}_k{k}_skip{skip}", "summary.json")
    if not os.path.exists(p): return None
    s = json.load(open(p))["steps"]
    key = "prefill_forward_us" if shape.startswith("prefill") else "decode_forward_us"
    v = (s.get(key) or {}).get("p50")  # null: no such steps
    return v / 1e3 if v else None
rows = ["| Phase | Tokens | t_1 (ms) | t_1,noAR (ms) | t_K (ms) | t_K,noAR (ms) | AR cost K=1 (ms) | AR cost K (ms) | Hidden | Split cost (ms) | t_K / t_1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|"]
res = {}
for shape in ["prefill4096", "prefill512", "decode256", "decode64", "decode16"]:
    a, b, c, d = t(shape, 1, "false"), t(shape, 1, "true"), t(shape, K, "false"), t(shape, K, "true")
    if None in (a, b, c, d):
        rows.append(f"| {shape} | | (missing runs) | | | | | | | | |"); continue
    base, ar = a - b, c - d
    hidden = 1 - ar / base if base > 0 else float("nan")
    res[shape] = dict(t1=a, t1_noar=b, tk=c, tk_noar=d, hidden=hidden, split_cost=d - b, speedup=a / c)
    phase = "Prefill" if shape.startswith("prefill") else "Decode"
    n = shape.replace("prefill", "").replace("decode", "")
    rows.append(f"| {phase} | {n} | {a:.3f} | {b:.3f} | {c:.3f} | {d:.3f} | {base:.3f} | {ar:.3f} | {100*hidden:.0f}% | {d - b:.3f} | {c / a:.3f} |")
md = f"# All-reduce overlap (K={K} buckets vs K=1)\n\nhidden = 1 - (t_K - t_K,noAR) / (t_1 - t_1,noAR); times are per-step GPU forward time (CUDA events), median over the measured steps (prefill: the prefill steps; decode: the steady decode steps). Split cost = t_K,noAR - t_1,noAR: what splitting the row-parallel GEMMs into K buckets costs by itself; t_K / t_1 is the end result.\n\n" + "\n".join(rows) + "\n"
open(os.path.join(out, "overlap.md"), "w").write(md)
json.dump(res, open(os.path.join(out, "overlap.json"), "w"), indent=1)
print(md)
PY
