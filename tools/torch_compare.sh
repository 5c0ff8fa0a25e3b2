#!/usr/bin/env bash
# symtp's decode step beside a plain PyTorch tensor-parallel one
# (bench/torch/tp_decode.py: eager kernels and torch.compile'd element-wise
# pieces, each with one CUDA graph per step) on the same GPUs, same shapes, in
# one call: for each TP, the PyTorch step's correctness check, then symtp's
# steady decode (tools/overlap.sh) and the two PyTorch forms at every batch.
# Writes compare.md and compare.json (ms per step, symtp / torch) to --out.
# Needs PyTorch with CUDA and torchrun; TP <= the visible GPUs.
#   tools/torch_compare.sh [--tp "1 2"] [--batches "1 32 256"] [--model llama-8b-shape]
#       [--layers 32] [--context 1024] [--out out/torch_compare]
# symtp runs first: each batch's PyTorch step then attends over as many keys
# as symtp's median measured step did (summary.json's steps.context).
# Uses $SYMTP_BIN when set (a device build), else tools/launch.sh. The PyTorch
# step's KV cache is contiguous and sized for the batch: at TP=1 llama-8b
# batch 512 (about 68 GB of cache and 16 GB of weights) does not fit 80 GB.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TPS="1 2" BATCHES="1 32 256" MODEL=llama-8b-shape LAYERS=32 CTX=1024 OUT=out/torch_compare
usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --tp) TPS=$2; shift 2;; --batches) BATCHES=$2; shift 2;; --model) MODEL=$2; shift 2;;
    --layers) LAYERS=$2; shift 2;; --context) CTX=$2; shift 2;; --out) OUT=$2; shift 2;;
    -h|--help) usage; exit 0;;
    *) echo "torch_compare.sh: unknown argument $1 (--help)" >&2; exit 2;;
  esac
done
command -v torchrun >/dev/null || { echo "torch_compare.sh: torchrun not found (PyTorch is needed)" >&2; exit 2; }
mkdir -p "$OUT"
csv=${BATCHES// /,}
failed=0
for tp in $TPS; do
  tr=(torchrun --standalone --nproc_per_node="$tp" "$ROOT/bench/torch/tp_decode.py")
  if ! "${tr[@]}" --check >"$OUT/check_tp$tp.log" 2>&1; then
    echo "torch_compare.sh: the PyTorch step failed its check at TP=$tp ($OUT/check_tp$tp.log)" >&2
    exit 1
  fi
  shapes=""; for b in $BATCHES; do shapes+="decode$b@$CTX "; done
  "$ROOT/tools/overlap.sh" --tp "$tp" --model "$MODEL" --overrides "layers=$LAYERS" --repeats 1 \
    --shapes "$shapes" --arms "symtp=" --out "$OUT/symtp_tp$tp" >"$OUT/symtp_tp$tp.log" 2>&1 \
    || { echo "torch_compare.sh: symtp TP=$tp failed ($OUT/symtp_tp$tp.log)" >&2; failed=1; }
  # The PyTorch step attends over context + 1 keys at every replay; symtp's
  # steady decode over more (its sequences are prefilled in chunks and the
  # first ones decode meanwhile, and contexts grow over the measured steps),
  # so each batch's PyTorch step runs at symtp's median step's context
  # (summary.json: steps.context), else at --context.
  ctxs=$(python3 - "$OUT/symtp_tp$tp" "$BATCHES" "$CTX" <<'PY'
import glob, json, sys
out, batches, ctx = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
res = []
for b in batches:
    c = ctx
    for p in sorted(glob.glob(f"{out}/decode{b}@{ctx}__symtp__skipfalse__r*/summary.json")):
        m = (json.load(open(p))["steps"].get("context") or {}).get("p50")
        if m: c = round(m) - 1
    res.append(str(c))
print(",".join(res))
PY
)
  for form in eager compiled; do
    flag=(); [[ $form == compiled ]] && flag=(--compile)
    "${tr[@]}" "${flag[@]}" --model "$MODEL" --layers "$LAYERS" --batches "$csv" --contexts "$ctxs" \
      --json "$OUT/torch_${form}_tp$tp.json" >"$OUT/torch_${form}_tp$tp.log" 2>&1 \
      || { echo "torch_compare.sh: PyTorch $form TP=$tp failed ($OUT/torch_${form}_tp$tp.log)" >&2; failed=1; }
  done
done
python3 - "$OUT" "$TPS" "$BATCHES" "$MODEL" "$LAYERS" "$CTX" <<'PY'
import json, os, sys
out, tps, batches, model, layers, ctx = sys.argv[1:]
batches = [int(b) for b in batches.split()]
def load(p):
    return json.load(open(p)) if os.path.exists(p) else None
rows, md = [], [f"# symtp vs a PyTorch tensor-parallel decode step ({model}, {layers} layers, context {ctx})", "",
                "ms per step (median); torch: CUDA graph replays of bench/torch/tp_decode.py, eager kernels or "
                "torch.compile'd element-wise pieces; symtp: steady decode from context " + ctx + ", GPU forward "
                "time (tools/overlap.sh). Keys: what a sequence attends over at symtp's median step, at which "
                "the PyTorch step runs.", "",
                "| TP | batch | keys | torch eager | torch compiled | symtp | symtp / eager | symtp / compiled |",
                "|---|---|---|---|---|---|---|---|"]
meta = {}
for tp in tps.split():
    t = {}
    for form in ("eager", "compiled"):
        d = load(f"{out}/torch_{form}_tp{tp}.json")
        if d:
            meta = {k: d[k] for k in ("torch", "cuda", "device")}
            t[form] = {r["batch"]: r["step_ms"] for r in d["rows"]}
            t["keys"] = {r["batch"]: r.get("context", int(ctx)) + 1 for r in d["rows"]}
    s = load(f"{out}/symtp_tp{tp}/overlap.json")
    sy = {int(k[6:].split("@")[0]): v["symtp"]["ms"] for k, v in s["shapes"].items()} if s else {}
    for b in batches:
        e, c, y = t.get("eager", {}).get(b), t.get("compiled", {}).get(b), sy.get(b)
        k = t.get("keys", {}).get(b)
        r = {"tp": int(tp), "batch": b, "keys": k, "torch_eager_ms": e, "torch_compiled_ms": c, "symtp_ms": y}
        r["symtp_over_eager"] = round(y / e, 3) if y and e else None
        r["symtp_over_compiled"] = round(y / c, 3) if y and c else None
        rows.append(r)
        f = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"
        md.append(f"| {tp} | {b} | {f(k, 0)} | {f(e)} | {f(c)} | {f(y)} | {f(r['symtp_over_eager'], 2)} | {f(r['symtp_over_compiled'], 2)} |")
json.dump({"model": model, "layers": int(layers), "context": int(ctx), **meta, "rows": rows},
          open(f"{out}/compare.json", "w"), indent=1)
open(f"{out}/compare.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
exit $failed
