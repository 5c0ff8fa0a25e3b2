#!/usr/bin/env bash
# The in-graph kernel timeline of decode steps (common/kernel_trace.h): a
# build with -DSYMTP_KERNEL_TRACE=ON (build-trace/) whose kernels record each
# block's entry, first grid-dependency wait and exit (%globaltimer), one symtp
# decode job per shape with SYMTP_KERNEL_TRACE_OUT set, and
# tools/kernel_timeline.py's table of each rank: per kernel, its exposed time
# on the step's critical path, how early its blocks entered and how long after
# the previous kernel's end its wait released; one layer launch by launch.
# The recording adds a few percent to the step (the step times are printed).
# SHAPES: "TP:BATCH ..." (default "2:1 2:4 2:32 1:1"), llama-8b-shape, 32
# layers, context 1024, CUDA graphs. Writes $OUT/<tp>_<batch>_rank<r>.{md,json}.
#   run(kind=nvidia-h100-x2, carry=[".deps"], command="tools/device/kernel_timeline.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PREFIX=$PWD/.deps/prefix/usr
[[ -d $PREFIX ]] || { echo "kernel_timeline.sh: $PREFIX missing: run tools/device/stage_deps.sh here and carry .deps" >&2; exit 2; }
export LD_LIBRARY_PATH=$PREFIX/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
W=$(mktemp -d)
cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
  -DSYMTP_KERNEL_TRACE=ON -DSYMTP_BUILD_TESTS=OFF >"$OUT/trace_configure.log" 2>&1 ||
  { tail -30 "$OUT/trace_configure.log"; exit 1; }
cmake --build build-trace -j "$(nproc)" --target symtp >"$OUT/trace_build.log" 2>&1 ||
  { grep -E "error" -A3 "$OUT/trace_build.log" | head -40; exit 1; }
rc=0
for shape in ${SHAPES:-2:1 2:4 2:32 1:1}; do
  tp=${shape%%:*} b=${shape##*:} n=tp${shape%%:*}_b${shape##*:}
  SYMTP_KERNEL_TRACE_OUT=$W/$n build-trace/tools/symtp launch --backend=cuda --tp="$tp" \
    --model=llama-8b-shape --model-overrides=layers=32 --steady-batch="$b" --max-batch="$b" \
    --steady-context=1024 --steady-steps=12 --warmup-steps=3 --max-batched-tokens=8192 \
    --prefill-chunk=8192 --progress=false --out="$W/o_$n" >"$W/$n.out" 2>"$W/$n.log" ||
    { echo "$n: symtp failed"; tail -5 "$W/$n.log"; rc=1; continue; }
  echo "$n: decode step p50 $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['steps']['decode_forward_us']['p50'])" "$W/o_$n/summary.json") us (recording)"
  for ((r = 0; r < tp; ++r)); do
    python3 tools/kernel_timeline.py "$W/$n.rank$r.bin" --json "$OUT/${n}_rank$r.json" \
      >"$OUT/${n}_rank$r.md" 2>&1 || { cat "$OUT/${n}_rank$r.md"; rc=1; }
  done
  cat "$OUT/${n}_rank0.md"
done
rm -rf "$W"
exit $rc
