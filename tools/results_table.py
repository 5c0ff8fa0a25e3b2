#!/usr/bin/env python3
"""Prints a results table (Markdown) from the committed
bench/results/<machine>/<measurement>/summary.json files: one row per
measurement and machine, with the machine, date and commit of the run.

  tools/results_table.py [--results DIR] [--scope headline|all] [--check FILE | --write FILE]

--scope headline (the default): the measurements that describe the system as
it is (README's table); all: every measurement, the studies of kept and
dropped changes included (bench/results/README.md's table).
--check: exit 1 when a row of the table is missing from that file (the
file's table is stale). --write: replace the file's table. Links are relative
to that file's folder.

Each summary.json holds "measurement", "machine", "device", "date", "commit",
"command" and "results"; the one-line result is built here from "results"
for the known measurements, or taken from results["headline_text"]."""
import argparse
import glob
import json
import os
import sys

ORDER = ["decode_step", "torch_baseline", "copy_exchange", "copy_exchange_70b", "copy_exchange_tp4", "copy_exchange_scatter", "copy_exchange_probe", "copy_exchange_chunked_attention", "exchange_allreduce", "prefill_wgmma", "prefill_wgmma_ablation", "prefill_attention", "attention_tma", "attention_plan_fill", "gemm_edge_probe", "gemm_algo_probe", "overlap_probe", "buckets", "kv_stream", "gemv", "kernel_timeline", "kernel_boundary", "grid_barrier", "attention_gap", "splitk_batches", "small_gemm", "mlp_chunks", "merge_skip_probe", "norm_skip_probe", "step_inputs_upload", "kv_prefetch_hint", "attention_grid", "attention_deep_ring", "attention_head_major", "attention_deep_nosplit", "gemv_mma_b8", "gemv_mma_ring", "gemv_rope", "gemv_fused_inputs", "prewait_inputs", "small_batch_decode", "attention_prefetch", "kernel_table", "attention_l2_promotion", "attention_box5", "attention_fill", "sharded_sampling", "gemm_workspace", "skinny_gemm", "merge_fold", "rope_fold_l2_prefetch", "l2_kslice_prefetch", "kv_l2_probe", "gemv_allreduce_push", "gemv_swiglu", "defer_norm", "gemv_rows34", "graph_max_batch", "read_bandwidth", "gemv_threads", "gemv_interleave", "prologue_loads", "attention_merge_skip", "fused_norm_two_shot",
         "small_batch_studies", "cleanup_step", "v0_vs_v1", "allreduce", "allreduce_two_shot_pipelined", "allreduce_two_shot", "allreduce_ll128", "allreduce_ll_limits", "allreduce_push", "fused_row_pairs", "allreduce_capacity", "abort_poll", "nccl_enqueue", "fused_norm", "overlap",
         "micro_batches", "attention_bandwidth", "ring_latency", "fault_teardown", "chaos"]
TITLES = {"decode_step": "Decode step vs batch", "copy_exchange": "Prefill all-reduce in two row chunks on the copy engines (kept)", "copy_exchange_70b": "Copy exchange at llama-70b shapes, TP 2", "copy_exchange_tp4": "Copy exchange at TP 4 (loses; off by default there)", "copy_exchange_scatter": "Copy exchange in reduce-scatter form at TP 4 (dropped)", "copy_exchange_probe": "Where the copy exchange's exposed time goes (probe)", "copy_exchange_chunked_attention": "Copy exchange with the attention chunked too (dropped)", "exchange_allreduce": "Exchange chunks all-reduced on a side stream at TP 4 (kept)", "prefill_wgmma": "Prefill attention on wgmma (kept)", "prefill_wgmma_ablation": "Where the wgmma prefill attention's time goes; three schedules that lost", "prefill_attention": "Prefill attention in FlashAttention-2's layout (superseded by wgmma)", "gemm_edge_probe": "Programmatic graph edge into a cuBLASLt GEMM (probe)", "gemm_algo_probe": "cuBLASLt heuristic candidates for decode GEMMs (probe)", "attention_tma": "Decode attention K/V tiles by TMA (kept)", "kv_stream": "Paged K/V stream: cp.async vs TMA (probe)", "overlap_probe": "Micro-batch overlap: attention beside the other half's GEMMs (probe)", "buckets": "All-reduce buckets vs one at large batch", "attention_plan_fill": "Decode attention unsplit at one block per SM, graphs without the merge (kept)", "mlp_chunks": "MLP over FFN chunks on two streams (probe)", "grid_barrier": "Grid barrier in a persistent kernel vs a PDL boundary (probe)", "norm_skip_probe": "Upper bound of folding the pushed all-reduce + RMSNorm into the next GEMV (probe)", "torch_baseline": "symtp vs a PyTorch TP decode step", "v0_vs_v1": "v0 vs v1 iteration time",
          "allreduce": "Custom all-reduce vs NCCL", "overlap": "All-reduce overlap (buckets)",
          "allreduce_capacity": "Custom all-reduce capacity 1 vs 8 MiB",
          "allreduce_push": "Custom all-reduce STAGED by push",
          "abort_poll": "Custom all-reduce: abort word through a device mirror (fix)",
          "nccl_enqueue": "Eager NCCL calls on a blocking communicator (fix)",
          "allreduce_ll_limits": "Custom all-reduce LL limits and grid",
          "allreduce_ll128": "Custom all-reduce LL128 protocol",
          "allreduce_two_shot": "Custom all-reduce two-shot protocol (TP 4)",
          "allreduce_two_shot_pipelined": "Two-shot all-reduce pipelined in chunks (TP 4)",
          "kernel_table": "Decode step by kernel", "attention_l2_promotion": "Decode attention: L2 promotion of the TMA boxes (kept)", "attention_box5": "Decode attention: one 5-D TMA box per tile (dropped)", "attention_fill": "Decode-attention splits that fill the SMs", "sharded_sampling": "Vocabulary-parallel sampling", "fused_norm": "Fused all-reduce + RMSNorm",
          "small_batch_decode": "Small-batch decode step",
          "attention_prefetch": "Decode attention K/V prefetch before the PDL wait", "gemm_workspace": "GEMM split-K workspace", "gemv": "Weight-streaming GEMV (M <= 4)",
          "kernel_timeline": "In-graph kernel timeline", "kernel_boundary": "Kernel boundary: PDL wait vs counter (dropped)", "gemv_rope": "RoPE in the QKV GEMV's epilogue (dropped)", "gemv_mma_b8": "Tensor-core GEMV, 8-row weight units (dropped)", "gemv_mma_ring": "Tensor-core GEMV through a shared-memory ring (dropped)", "splitk_batches": "Split-K over cuBLASLt batches (dropped)", "attention_gap": "Decode attention vs torch SDPA (studies, dropped)", "kv_prefetch_hint": "L2 prefetch hint on K/V copies", "step_inputs_upload": "Step inputs in one upload", "attention_grid": "Attention graph grid in one wave (dropped)", "attention_deep_ring": "Deep copy ring in the decode attention (dropped)", "attention_head_major": "Head-major attention launch order (dropped)", "attention_deep_nosplit": "Attention without a split on a deep ring (dropped)", "gemv_fused_inputs": "GEMV with fused SiLU / merge inputs (dropped)",
          "prewait_inputs": "Step inputs before the PDL wait (dropped)",
          "skinny_gemm": "Small-M GEMM kernel (dropped)",
          "merge_fold": "Split merge in the attention kernel (dropped)",
          "rope_fold_l2_prefetch": "RoPE fold and L2 weight prefetch (dropped)",
          "l2_kslice_prefetch": "L2 prefetch of weight rows' first columns (dropped)",
          "kv_l2_probe": "K/V pages prefetched into L2 (probe, dropped)",
          "small_gemm": "Stream-K wgmma GEMM for 5-64 rows (dropped)",
          "merge_skip_probe": "Upper bound of removing the split merge (probe)",
          "gemv_allreduce_push": "GEMV sending its output to every rank (kept)",
          "gemv_swiglu": "GEMV with SwiGLU in its flush (kept)",
          "attention_merge_skip": "Split merge skipped for unsplit tokens",
          "fused_norm_two_shot": "Fused all-reduce + RMSNorm on the two-shot protocol (dropped)",
          "small_batch_studies": "Small-batch decode studies", "cleanup_step": "Decode step across the clean-up",
          "micro_batches": "Micro-batch overlap (removed)",
          "attention_bandwidth": "Decode attention bandwidth", "ring_latency": "Ring latency",
          "fault_teardown": "Fault teardown", "chaos": "Chaos trials and hostile flags",
          "load": "v0 and v1 under load", "load_inflight": "v1's pipeline depth and TTFT at low load", "first_steps": "A job's first steps", "gpu_warmup": "GPU warm-up before a worker is ready (kept)", "gpu_warmup_ladder": "GPU warm-up: GEMMs over a row ladder (kept)", "gemm_warmup_plans": "GPU warm-up: every row count planned (dropped)", "late_publish": "v1 late publishing at low load (kept)", "defer_norm": "Deferred RMSNorm at TP 1 (kept)", "gemv_rows34": "GEMV at 3-4 rows: two blocks per SM (kept)", "graph_max_batch": "A graph for the job's largest decode batch (kept)", "read_bandwidth": "Read bandwidth against the weight GEMMs", "gemv_threads": "GEMV at 1-2 rows: 1024 threads per SM (kept)", "gemv_interleave": "GEMV rows dealt round-robin (dropped)", "prologue_loads": "RoPE and SiLU loads before the norm reduction (dropped)", "pacer_dominance": "Late publishing behind prefill steps too (dropped)", "prefill_chunk": "Per-request prefill chunk under load", "cublaslt_first_use": "cuBLASLt's first-call costs in a job's steps (probe)", "exchange_decode": "Exchange row chunks at decode, TP 4 (dropped)", "preload_gemm": "GEMM with its weights copied into shared memory before the PDL wait (dropped)", "fused_row_pairs": "Fused all-reduce + RMSNorm in row pairs at TP 2 (kept)"}
# The measurements of the system as it is; the others are studies (an A/B
# of one change, kept or dropped), listed in bench/results/README.md.
HEADLINE = {"decode_step", "gpu_warmup", "gpu_warmup_ladder", "late_publish", "torch_baseline", "prefill_wgmma", "v0_vs_v1", "load", "kernel_table", "allreduce",
            "attention_bandwidth", "ring_latency", "fault_teardown", "chaos"}
MACHINES = ["h200x4", "h200x2", "h200", "h100x4", "h100x2", "h100", "cpu-dev"]


def span(xs, fmt="{:.2f}"):
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def headline(doc):
    r, m = doc["results"], doc["measurement"]
    if "headline_text" in r:
        return r["headline_text"]
    if m == "decode_step":
        h = r["headline"]
        return (f"{h['model']}, {h['layers']} layers, TP={h['tp']}: "
                + " / ".join(f"{x:.2f}" for x in h["forward_ms"])
                + f" ms at batch {' / '.join(str(b) for b in h['batches'])}")
    if m == "v0_vs_v1":
        parts = []
        for tp in sorted({c["tp"] for c in r["cells"]}):
            cs = [c for c in r["cells"] if c["tp"] == tp]
            parts.append(f"TP={tp} {span([c['speedup'] for c in cs])}x")
        bs = sorted({c["batch"] for c in r["cells"]})
        model = r.get("model", "")
        return (f"v1 speedup over v0: {', '.join(parts)} (batch {bs[0]}-{bs[-1]}"
                + (f", {model}" if model else "") + ")")
    if m == "allreduce":
        pick = {c["bytes"]: c for c in r["per_call"]}
        cells = [f"{pick[b]['ratio']:.2f}x at {b >> 10} KiB" for b in (65536, 262144) if b in pick]
        if 1 << 20 in pick:
            cells.append(f"{pick[1 << 20]['ratio']:.2f}x at 1 MiB")
        wrong = sum(c["wrong"] for c in r["per_call"])
        return f"custom / NCCL time per call (bf16, TP=2, graphs): {', '.join(cells)}; {wrong} wrong elements"
    if m == "overlap":
        t = r["t_k_over_t_1"]
        d256 = [x["decode256"] for runs in t.values() for x in runs if "decode256" in x]
        d16 = [x["decode16"] for runs in t.values() for x in runs if "decode16" in x]
        return (f"{r['k']} buckets / 1: {span(d256, '{:.3f}')} at decode batch 256, "
                f"{span(d16, '{:.3f}')} at batch 16 (below 1 pays); default 1 bucket")
    if m == "attention_bandwidth":
        return "; ".join(f"{row['shape']}: {span(row['percent_of_copy_bandwidth'], '{:.0f}')}% of copy bandwidth"
                         for row in r["rows"])
    if m == "ring_latency":
        h = r.get("headline")
        if not h:
            rows = [x for x in r["rows"] if x["bytes"] == 4096 and x["case"] == "in place"]
            h = rows[0] if rows else r["rows"][0]
        return (f"{h['consumers']} consumer(s), {h['bytes'] // 1024} KiB, {h['case']}: "
                f"p50 {h['p50_us']:.2f} us, p99 {h['p99_us']:.2f} us")
    if m == "fault_teardown":
        return (f"SIGKILL a worker at TP={r['tp']}: job ends in {r['seconds_to_exit']:.2f} s, exit "
                f"{r['launcher_exit_code']}, {r['processes_left']} processes / "
                f"{r['shm_segments_left']} segments left")
    return ""


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "results")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=root)
    ap.add_argument("--scope", choices=["headline", "all"], default="headline")
    ap.add_argument("--check", metavar="FILE", help="fail if FILE lacks a row of the table")
    ap.add_argument("--write", metavar="FILE",
                    help="replace the table in FILE (the block of lines from its header row)")
    a = ap.parse_args()
    # Links relative to the file the table goes into (the repository root when printed).
    target = a.check or a.write
    base = os.path.dirname(os.path.abspath(target)) if target else os.path.join(a.results, "..", "..")
    docs = []
    for p in glob.glob(os.path.join(a.results, "*", "*", "summary.json")):
        with open(p) as f:
            d = json.load(f)
        if a.scope == "all" or d["measurement"] in HEADLINE:
            d["_path"] = os.path.relpath(os.path.dirname(p), base)
            docs.append(d)
    if not docs:
        print(f"results_table.py: no summary.json under {a.results}", file=sys.stderr)
        return 1

    def key(d):
        m = d["measurement"]
        return (ORDER.index(m) if m in ORDER else len(ORDER), m,
                MACHINES.index(d["machine"]) if d["machine"] in MACHINES else len(MACHINES))
    lines = ["| Measurement | Machine | Result | Date | Commit |", "|---|---|---|---|---|"]
    for d in sorted(docs, key=key):
        title = TITLES.get(d["measurement"], d["measurement"])
        lines.append(f"| [{title}]({d['_path']}/summary.md) | {d['machine']} | {headline(d)} | "
                     f"{d['date']} | `{d['commit']}` |")
    if a.check:
        with open(a.check) as f:
            have = set(f.read().splitlines())
        missing = [l for l in lines if l not in have]
        for l in missing:
            print(f"results_table.py: {a.check} lacks: {l}", file=sys.stderr)
        return 1 if missing else 0
    if a.write:
        with open(a.write) as f:
            text = f.read().split("\n")
        if lines[0] not in text:
            print(f"results_table.py: {a.write} has no line {lines[0]!r}", file=sys.stderr)
            return 1
        begin = text.index(lines[0])
        end = begin
        while end < len(text) and text[end].startswith("|"):
            end += 1
        text[begin:end] = lines
        with open(a.write, "w") as f:
            f.write("\n".join(text))
        return 0
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
