#!/usr/bin/env bash
# Per-step decode time sweep: presets x TP x CUDA graphs on/off x attention kernel x batch, steady
# decode at a fixed context, v1 mode. Writes DIR/decode.md and DIR/decode.json
# (GPU forward time by CUDA events, median over the steady steps; iteration time).
#   tools/decode_sweep.sh [--models "llama-8b-shape llama-70b-shape"] [--overrides layers=4]
#       [--tps "1 2"] [--batches "1 8 32 128 256 512"] [--graphs "true false"] [--context 1024]
#       [--steps 30] [--backend cuda] [--attention "tensor-core"] [--out out/decode]
#       [--extra "--allreduce=nccl"]   (more launcher flags for every run)
# Uses $SYMTP_BIN when set (the device run script), else tools/launch.sh.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODELS="llama-8b-shape llama-70b-shape" OVERRIDES=layers=4 TPS="1 2" BATCHES="1 8 32 128 256 512"
GRAPHS="true false" CONTEXT=1024 STEPS=30 BACKEND=cuda OUT=out/decode ATTENTION=tensor-core EXTRA=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --models) MODELS=$2; shift 2;; --overrides) OVERRIDES=$2; shift 2;; --tps) TPS=$2; shift 2;;
    --batches) BATCHES=$2; shift 2;; --graphs) GRAPHS=$2; shift 2;; --context) CONTEXT=$2; shift 2;;
    --steps) STEPS=$2; shift 2;; --backend) BACKEND=$2; shift 2;; --out) OUT=$2; shift 2;;
    --attention) ATTENTION=$2; shift 2;; --extra) EXTRA=$2; shift 2;;
    *) echo "decode_sweep.sh: unknown argument $1" >&2; exit 2;;
  esac
done
source "$ROOT/tools/lib/launch.sh"
mkdir -p "$OUT"
failed=0
for m in $MODELS; do
  for tp in $TPS; do
    for g in $GRAPHS; do
     for att in $ATTENTION; do
      for b in $BATCHES; do
        dir=$OUT/${m}_tp${tp}_graphs${g}_att${att}_b$b
        echo "decode_sweep: $m tp=$tp graphs=$g attention=$att batch=$b" >&2
        symtp_run --backend="$BACKEND" --tp="$tp" --model="$m" --model-overrides="$OVERRIDES" \
          --cuda-graphs="$g" --attention="$att" --steady-batch="$b" --max-batch="$b" --steady-context="$CONTEXT" \
          --steady-steps="$STEPS" --warmup-steps=5 --max-batched-tokens=4096 --prefill-chunk=4096 \
          --progress=false $EXTRA --out="$dir" 2>"$dir.log" || { echo "decode_sweep: FAILED, see $dir.log" >&2; failed=1; }
        rm -f "$dir/tokens.jsonl" "$dir/prompts.jsonl"
      done
     done
    done
  done
done
python3 - "$OUT" "$OVERRIDES" "$CONTEXT" <<'PY'
import json, os, sys
out, ov, ctx = sys.argv[1], sys.argv[2], sys.argv[3]
rows, res = [], []
for name in sorted(os.listdir(out)):
    p = os.path.join(out, name, "summary.json")
    if not os.path.isfile(p):
        continue
    s = json.load(open(p))
    st = s["steps"]
    model, rest = name.split("_tp")
    tp, rest = rest.split("_graphs")
    g, rest = rest.split("_att")
    att, b = rest.rsplit("_b", 1)
    r = dict(model=model, tp=int(tp), graphs=g == "true", attention=att, batch=int(b),
             forward_ms=((st["decode_forward_us"] or {}).get("p50") or 0) / 1e3,
             iteration_ms=st.get("period_ms") or (st["iteration_ms"] or {}).get("p50") or 0,
             gpu_idle_us=(st["gpu_idle_us"] or {}).get("p50") or 0, steps=st["measured"])
    res.append(r)
res.sort(key=lambda r: (r["model"], r["tp"], not r["graphs"], r["attention"], r["batch"]))
lines = [f"# Decode step time (steady decode, context {ctx}, overrides `{ov}`)", "",
         "Forward = GPU time per step by CUDA events (median); iteration = the step period.", "",
         "| Model | TP | Graphs | Attention | Batch | Forward (ms) | Iteration (ms) | GPU idle (us) | Steps |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in res:
    lines.append(f"| {r['model']} | {r['tp']} | {'on' if r['graphs'] else 'off'} | {r['attention']} | {r['batch']} | "
                 f"{r['forward_ms']:.3f} | {r['iteration_ms']:.3f} | {r['gpu_idle_us']:.1f} | {r['steps']} |")
open(os.path.join(out, "decode.md"), "w").write("\n".join(lines) + "\n")
json.dump(res, open(os.path.join(out, "decode.json"), "w"), indent=1)
print("\n".join(lines))
PY
exit $failed
