#!/usr/bin/env bash
# One command for a GPU run on the device machine (see docs/GPU.md, remote-run scripts):
#   builds from the carried tree + .deps, runs the GPU tests and benchmarks,
#   and leaves everything under $OUT: gpu_run.log and results.tar.gz
#   (JSON, Markdown, PNG). Steps can be chosen: STEPS="build test ar ipc kernels launch ardecode decode fault overlap report";
#   GPU_TEST_REGEX limits the gpu tests (ctest -R); OVERLAP_EXTRA / REPORT_EXTRA pass
#   launcher flags (e.g. "--attention=tensor-core") to the overlap and report runs;
#   KERNELS_ARGS passes kernels_bench flags (e.g. "--sections gemm");
#   DECODE_MODELS / DECODE_OVERRIDES / DECODE_ATTENTION / DECODE_GRAPHS / DECODE_TPS shape the
#   decode sweep (e.g. DECODE_MODELS=llama-8b-shape DECODE_OVERRIDES=layers=32; DECODE_BATCHES,
#   DECODE_EXTRA="--allreduce=nccl" for launcher flags); FAULT_TP the kill test. The all-reduce
#   bench, the end-to-end launches, the decode sweep, the report and the kill test run every
#   TP degree (1, 2, 4, 8) the machine's GPUs allow, or the largest of them.
# From the development machine, with the `device` tool:
#   tools/device/stage_deps.sh           # once; stages Abseil/GTest/benchmark into .deps/
#   run(kind=nvidia-h200-x2, carry=[".deps"], command="tools/device/gpu_run.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source tools/device/device_env.sh
R=$OUT/results
mkdir -p "$R" "$R/launch"
LOG=$OUT/gpu_run.log
STEPS=${STEPS:-"build test ar ipc kernels launch ardecode overlap report"}
B=build-gpu
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
# On a one-GPU machine the TP=2 steps cannot run: leave them out and say so.
if (( NGPU < 2 )); then
  for s in ar ardecode overlap; do
    [[ " $STEPS " == *" $s "* ]] && echo "gpu_run: $NGPU GPU(s): step '$s' needs 2, left out"
  done
  STEPS=" $STEPS "; for s in ar ardecode overlap; do STEPS=${STEPS// $s / }; done
fi
# TP degrees this machine can run (1, 2, 4, 8 up to its GPU count); TP_MAX the largest.
TPS_ALL=1; for t in 2 4 8; do (( NGPU >= t )) && TPS_ALL+=" $t"; done
TP_MAX=${TPS_ALL##* }
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo "=== $(date +%T) $*" | tee -a "$LOG"; }
finish() {
  # Per-request outputs of the benchmark runs are large and not needed (the
  # launch checks keep theirs); files coming back are limited to 16 MiB.
  find "$R" -mindepth 2 \( -name tokens.jsonl -o -name prompts.jsonl \) -not -path "*/launch/*" -delete
  (cd "$OUT" && tar czf results.tar.gz results && rm -rf results)
  step "done"
}
trap finish EXIT

{
  step "device"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  nvidia-smi topo -m || true
  nproc; free -g | head -2
} >>"$LOG" 2>&1
cp "$LOG" "$R/device_info.txt"

if has build; then
  step "build"
  tools/device/build.sh >>"$LOG" 2>&1 || { step "BUILD FAILED"; tail -50 "$LOG"; exit 1; }
fi
if has test; then
  step "gpu tests"
  # On 4 GPUs the suite runs past 5 minutes (allreduce_test's graph-replay
  # case alone took 136 s at TP 2 and 4 on H100 x4): this bound is only
  # against a hang; each test keeps its own (--timeout).
  (cd $B && timeout 1200 ctest -L gpu ${GPU_TEST_REGEX:+-R "$GPU_TEST_REGEX"} --output-on-failure --timeout 240) >"$R/gpu_tests.log" 2>&1
  tail -15 "$R/gpu_tests.log" | tee -a "$LOG"
fi
if has ar && [[ -x $B/bench/allreduce/allreduce_bench ]]; then
  step "allreduce bench"
  for tp in $TPS_ALL; do
    [[ $tp == 1 ]] && continue
    timeout 180 $B/bench/allreduce/allreduce_bench --tp $tp --json "$R/allreduce_tp$tp.json" >"$R/allreduce_tp$tp.txt" 2>&1
    tail -40 "$R/allreduce_tp$tp.txt" | tee -a "$LOG"
  done
fi
if has ipc && [[ -x $B/bench/ipc/ipc_bench ]]; then
  step "ipc bench"
  timeout 180 $B/bench/ipc/ipc_bench --benchmark_format=json --benchmark_out="$R/ipc_bench_device.json" \
    --benchmark_out_format=json >"$R/ipc_bench_device.txt" 2>&1
  tail -30 "$R/ipc_bench_device.txt" | tee -a "$LOG"
  step "ipc bench, latency cases pinned to distinct cores (--ipc_pin)"
  timeout 120 $B/bench/ipc/ipc_bench --ipc_pin --benchmark_filter='BM_Latency' --benchmark_format=json \
    --benchmark_out="$R/ipc_bench_device_pinned.json" --benchmark_out_format=json \
    >"$R/ipc_bench_device_pinned.txt" 2>&1
  tail -20 "$R/ipc_bench_device_pinned.txt" | tee -a "$LOG"
  step "ipc bench, latency cases pinned, producer demoting records to L3 (--ipc_demote)"
  timeout 120 $B/bench/ipc/ipc_bench --ipc_pin --ipc_demote --benchmark_filter='BM_Latency' \
    --benchmark_format=json --benchmark_out="$R/ipc_bench_device_pinned_demote.json" \
    --benchmark_out_format=json >"$R/ipc_bench_device_pinned_demote.txt" 2>&1
  tail -20 "$R/ipc_bench_device_pinned_demote.txt" | tee -a "$LOG"
fi
if has kernels && [[ -x $B/bench/kernels/kernels_bench ]]; then
  step "kernels bench"
  timeout 240 $B/bench/kernels/kernels_bench ${KERNELS_ARGS:-} --json "$R/kernels.json" >"$R/kernels.txt" 2>&1
  tail -40 "$R/kernels.txt" | tee -a "$LOG"
fi
if has launch; then
  step "launch: cuda backend end to end (tokens vs the CPU backend)"
  W="--model=tiny --num-requests=24 --prompt-len=uniform:8:80 --output-len=uniform:4:24 --max-batch=8 --progress=false"
  timeout 60 $B/tools/symtp launch --backend=cpu --tp=1 $W --out="$R/launch/cpu_tp1" >"$R/launch/cpu_tp1.log" 2>&1 || true
  for tp in $TPS_ALL; do
    for ar in nccl custom; do
      d=$R/launch/cuda_fp32_tp${tp}_$ar
      timeout 120 $B/tools/symtp launch --backend=cuda --dtype=fp32 --allreduce=$ar --tp=$tp $W --out="$d" >"$d.log" 2>&1
      echo "cuda fp32 tp=$tp allreduce=$ar exit $? tokens==cpu: $(cmp -s "$d/tokens.jsonl" "$R/launch/cpu_tp1/tokens.jsonl" && echo yes || echo NO)" | tee -a "$LOG"
      echo "  decode steps from CUDA graphs: $(python3 -c "import json, sys; s = json.load(open(sys.argv[1]))['steps']; print(s.get('decode_from_graphs'), '/', s.get('decode'))" "$d/summary.json" 2>/dev/null)" | tee -a "$LOG"
    done
    # The copy exchange on every step of 64 rows or more.
    if (( tp > 1 )); then
      d=$R/launch/cuda_fp32_tp${tp}_exchange
      timeout 120 $B/tools/symtp launch --backend=cuda --dtype=fp32 --allreduce=custom --exchange-min-rows=64 --tp=$tp $W --out="$d" >"$d.log" 2>&1
      echo "cuda fp32 tp=$tp --exchange-min-rows=64 exit $? tokens==cpu: $(cmp -s "$d/tokens.jsonl" "$R/launch/cpu_tp1/tokens.jsonl" && echo yes || echo NO)" | tee -a "$LOG"
      # ... its chunks all-reduced on a side stream, through the two-shot
      # kernel (messages from 1 KiB) and through NCCL.
      for ar in custom nccl; do
        d=$R/launch/cuda_fp32_tp${tp}_exchange_allreduce_$ar
        timeout 120 $B/tools/symtp launch --backend=cuda --dtype=fp32 --allreduce=$ar --exchange-min-rows=64 --exchange-transport=allreduce \
          --custom-allreduce-ll-max-bytes=512 --custom-allreduce-ll128-max-bytes=0 --custom-allreduce-two-shot-min-bytes=1024 $W --out="$d" >"$d.log" 2>&1
        echo "cuda fp32 tp=$tp --exchange-transport=allreduce ($ar) exit $? tokens==cpu: $(cmp -s "$d/tokens.jsonl" "$R/launch/cpu_tp1/tokens.jsonl" && echo yes || echo NO)" | tee -a "$LOG"
      done
    fi
  done
  d=$R/launch/cuda_bf16_tp${TP_MAX}
  timeout 120 $B/tools/symtp launch --backend=cuda --tp=$TP_MAX $W --out="$d" >"$d.log" 2>&1
  echo "cuda bf16 tp=$TP_MAX v1 exit $?" | tee -a "$LOG"
  d=$R/launch/cuda_bf16_tp${TP_MAX}_v0
  timeout 120 $B/tools/symtp launch --backend=cuda --mode=v0 --tp=$TP_MAX $W --out="$d" >"$d.log" 2>&1
  echo "cuda bf16 tp=$TP_MAX v0 exit $? tokens==v1(bf16): $( [[ -f $R/launch/cuda_bf16_tp${TP_MAX}/tokens.jsonl ]] && { cmp -s "$d/tokens.jsonl" "$R/launch/cuda_bf16_tp${TP_MAX}/tokens.jsonl" && echo yes || echo "no: bf16 rounding may differ (the modes cut prompts into steps differently)"; } || echo n/a)" | tee -a "$LOG"
  # Top-k / top-p sampling: at TP > 1, v1 draws from the ranks' top candidates
  # (--sharded-sampling) and v0 from the gathered logits; both must give the CPU's tokens.
  TK="--temperature=0.8 --top-k=20 --top-p=0.9"
  timeout 60 $B/tools/symtp launch --backend=cpu --tp=1 $W $TK --out="$R/launch/cpu_tp1_topk" >"$R/launch/cpu_tp1_topk.log" 2>&1 || true
  for mode in v1 v0; do
    d=$R/launch/cuda_fp32_tp${TP_MAX}_topk_$mode
    timeout 120 $B/tools/symtp launch --backend=cuda --dtype=fp32 --mode=$mode --tp=$TP_MAX $W $TK --out="$d" >"$d.log" 2>&1
    echo "cuda fp32 tp=$TP_MAX $mode top-k exit $? tokens==cpu: $(cmp -s "$d/tokens.jsonl" "$R/launch/cpu_tp1_topk/tokens.jsonl" && echo yes || echo NO)" | tee -a "$LOG"
  done
  # KV cache sized by the workers from free GPU memory, and the tensor-core attention.
  d=$R/launch/cuda_fp32_tp${TP_MAX}_kvfraction
  timeout 120 $B/tools/symtp launch --backend=cuda --dtype=fp32 --tp=$TP_MAX --kv-cache-fraction=0.3 $W --out="$d" >"$d.log" 2>&1
  echo "cuda fp32 tp=$TP_MAX --kv-cache-fraction=0.3 exit $? tokens==cpu: $(cmp -s "$d/tokens.jsonl" "$R/launch/cpu_tp1/tokens.jsonl" && echo yes || echo NO); $(grep -o 'KV cache: [0-9]* blocks' "$d.log")" | tee -a "$LOG"
  # The default attention is tensor-core: compare it with the tiled kernel.
  d=$R/launch/cuda_bf16_tp${TP_MAX}_tiled
  timeout 120 $B/tools/symtp launch --backend=cuda --tp=$TP_MAX --attention=tiled $W --out="$d" >"$d.log" 2>&1
  echo "cuda bf16 tp=$TP_MAX --attention=tiled exit $? tokens==tensor-core(bf16, default): $(cmp -s "$d/tokens.jsonl" "$R/launch/cuda_bf16_tp${TP_MAX}/tokens.jsonl" && echo yes || echo no: bf16 rounding may differ)" | tee -a "$LOG"
  tail -n 5 "$R"/launch/*.log >>"$LOG" 2>&1
fi
if has ardecode; then
  step "decode step: custom all-reduce vs NCCL"
  mkdir -p "$R/ardecode"
  for b in 16 64 256; do
    for ar in nccl custom; do
      d=$R/ardecode/${ar}_b$b
      timeout 120 $B/tools/symtp launch --backend=cuda --tp=2 --model=llama-70b-shape \
        --model-overrides="${ARDECODE_OVERRIDES:-layers=4}" --allreduce=$ar --steady-batch=$b \
        --max-batch=$b --steady-context=1024 --steady-steps=50 --warmup-steps=5 \
        --max-batched-tokens=4096 --prefill-chunk=4096 --progress=false --out="$d" >"$d.log" 2>&1 \
        || echo "ardecode $ar b=$b FAILED" | tee -a "$LOG"
    done
  done
  python3 - "$R/ardecode" <<'PY' | tee -a "$LOG"
import json, os, sys
d = sys.argv[1]
rows = ["| Batch | NCCL step (ms) | custom step (ms) | custom / NCCL | NCCL iteration (ms) | custom iteration (ms) |", "|---|---|---|---|---|---|"]
res = {}
for b in (16, 64, 256):
    v = {}
    for ar in ("nccl", "custom"):
        p = os.path.join(d, f"{ar}_b{b}", "summary.json")
        if os.path.exists(p):
            st = json.load(open(p))["steps"]
            v[ar] = (st["decode_forward_us"]["p50"] / 1e3, st["iteration_ms"]["p50"])
    res[b] = v
    if len(v) == 2:
        rows.append(f"| {b} | {v['nccl'][0]:.3f} | {v['custom'][0]:.3f} | {v['custom'][0] / v['nccl'][0]:.3f} | {v['nccl'][1]:.3f} | {v['custom'][1]:.3f} |")
    else:
        rows.append(f"| {b} | (missing) | | | | |")
md = "# Decode step: custom one-shot all-reduce vs NCCL (TP=2, llama-70b-shape, reduced layers)\n\nGPU forward time per step by CUDA events (median of the steady decode steps, context 1024, CUDA graphs on) and the iteration time.\n\n" + "\n".join(rows) + "\n"
open(os.path.join(d, "ardecode.md"), "w").write(md)
json.dump(res, open(os.path.join(d, "ardecode.json"), "w"), indent=1)
print(md)
PY
fi
if has decode; then
  step "decode step sweep (presets x TP x graphs x batch)"
  SYMTP_BIN=$B/tools/symtp timeout 500 tools/decode_sweep.sh --tps "${DECODE_TPS:-$TPS_ALL}" \
    ${DECODE_MODELS:+--models "$DECODE_MODELS"} \
    --overrides "${DECODE_OVERRIDES:-layers=4}" --attention "${DECODE_ATTENTION:-tensor-core}" \
    ${DECODE_GRAPHS:+--graphs "$DECODE_GRAPHS"} ${DECODE_BATCHES:+--batches "$DECODE_BATCHES"} \
    ${DECODE_EXTRA:+--extra "$DECODE_EXTRA"} --out "$R/decode" >"$R/decode.log" 2>&1
  tail -40 "$R/decode.log" | tee -a "$LOG"
fi
if has fault; then
  # Kill one worker mid-decode on GPUs: the job must end (non-zero, naming the
  # worker) within ~1 s of the death, with no process, shared memory or GPU
  # context left behind.
  tp=${FAULT_TP:-$TP_MAX}
  step "fault: SIGKILL a worker mid-decode (tp $tp)"
  d=$R/fault
  mkdir -p "$d"
  ls /dev/shm | grep -c symtp >"$d/shm_before.txt" || true
  # max_seq_len raised so that the steady decode outlasts the wait (at the
  # preset's 4096 it ended after ~3600 steps, 7 s, before the kill).
  $B/tools/symtp launch --backend=cuda --tp=$tp --model=llama-8b-shape \
    --model-overrides=layers=4,max_seq_len=65536 --steady-batch=64 --max-batch=64 \
    --steady-context=512 --steady-steps=60000 --progress=false \
    --out="$d/run" >"$d/launch.log" 2>&1 &
  lp=$!
  sleep 20
  victim=$(pgrep -f "symtp worker.*--rank=$((tp - 1))" | head -1)
  [[ -z $victim ]] && victim=$(pgrep -P "$lp" | tail -1)
  [[ -z $victim ]] && echo "fault: no worker found to kill (did the job end early?)" | tee -a "$LOG"
  t_kill=$(date +%s.%N)
  kill -9 "$victim" 2>/dev/null
  # tail checks the pid once per --sleep-interval (1 s by default, which
  # would round every exit time up to a second).
  timeout 30 tail --pid="$lp" -s 0.01 -f /dev/null
  wait "$lp"; rc=$?
  t_end=$(date +%s.%N)
  sleep 1
  {
    echo "killed pid $victim; launcher exit $rc after $(awk "BEGIN{print $t_end - $t_kill}") s"
    echo "symtp processes left: $(pgrep -fc 'symtp (worker|scheduler)' || true)"
    echo "symtp shm segments before/after: $(cat "$d/shm_before.txt") / $(ls /dev/shm | grep -c symtp)"
    echo "GPU processes: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)"
    tail -n 3 "$d/launch.log"
  } | tee "$d/fault.txt" | tee -a "$LOG"
fi
if has overlap; then
  step "overlap"
  SYMTP_BIN=$B/tools/symtp timeout 300 tools/overlap.sh --tp 2 --k 4 --model llama-70b-shape \
    --overrides "${OVERLAP_OVERRIDES:-layers=4}" --out "$R/overlap" ${OVERLAP_EXTRA:+-- $OVERLAP_EXTRA} >"$R/overlap.log" 2>&1
  tail -12 "$R/overlap.log" | tee -a "$LOG"
fi
if has report && [[ -x tools/report.sh ]]; then
  step "v0 vs v1 report"
  SYMTP_BIN=$B/tools/symtp timeout 400 tools/report.sh --backend cuda --tps "$TPS_ALL" \
    --model llama-70b-shape --overrides "${REPORT_OVERRIDES:-layers=4}" --out "$R/report" \
    ${REPORT_EXTRA:+-- $REPORT_EXTRA} >"$R/report.log" 2>&1
  tail -20 "$R/report.log" | tee -a "$LOG"
fi
