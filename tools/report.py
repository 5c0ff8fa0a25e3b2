#!/usr/bin/env python3
"""Builds the v0-vs-v1 report (Markdown + PNG plots) from the runs that
tools/report.sh made: runs/<mode>_tp<N>_b<B>/summary.json."""
import argparse
import datetime
import json
import os
import platform
import re
import sys


def load(runs):
    data = {}
    for name in sorted(os.listdir(runs)):
        m = re.fullmatch(r"(v0|v1)_tp(\d+)_b(\d+)", name)
        path = os.path.join(runs, name, "summary.json")
        if not m or not os.path.exists(path):
            continue
        with open(path) as f:
            data[(m.group(1), int(m.group(2)), int(m.group(3)))] = json.load(f)
    return data


def p50(s, key):
    return s["steps"][key]["p50"]


def phases(s):
    """Per-iteration phases in ms (p50 over measured steps)."""
    st = s["steps"]
    fwd = st["device_forward_us"]["p50"] or st["forward_us"]["p50"]
    return {
        "schedule": (st["schedule_us"]["p50"]) / 1e3,
        "encode": st["encode_us"]["p50"] / 1e3,
        "publish": st["publish_us"]["p50"] / 1e3,
        "recv": st["recv_wait_us"]["p50"] / 1e3,
        "apply": st["apply_us"]["p50"] / 1e3,
        "build": st["build_us"]["p50"] / 1e3,
        "forward": fwd / 1e3,
        "sample": st["sample_us"]["p50"] / 1e3,
        "return": st["result_return_us"]["p50"] / 1e3,
        "iteration": st["iteration_ms"]["p50"],
        "idle": st["gpu_idle_us"]["p50"] / 1e3,
        "bytes": st["wire_bytes"]["p50"],
        "measured": st["measured"],
    }


def fmt(x, d=4):
    return f"{x:.{d}f}"


def human_bytes(b):
    if b >= 1 << 20:
        return f"{b / (1 << 20):.2f} MB"
    if b >= 1 << 10:
        return f"{b / (1 << 10):.1f} KB"
    return f"{b:.0f} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", default="?")
    ap.add_argument("--model", default="?")
    ap.add_argument("--overrides", default="")
    a = ap.parse_args()
    data = load(a.runs)
    if not data:
        print("report.py: no runs found", file=sys.stderr)
        return 1
    any_run = next(iter(data.values()))
    tps = sorted({k[1] for k in data})
    batches = sorted({k[2] for k in data})
    md = []
    md.append("# v0 vs v1 iteration time\n")
    md.append(f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} on "
              f"`{platform.node()}`; backend **{any_run['backend']}**; model "
              f"**{a.model}** {('(' + a.overrides + ')') if a.overrides else ''}: "
              f"`{json.dumps(any_run['model'])}`.\n")
    md.append(f"Steady decode: the batch is held at exactly B running sequences at context "
              f"{a.context}; each cell is the median over the measured steps (warm-up excluded). "
              "v0: rank 0 schedules inline, builds the full padded batch "
              "([B, max_seq_len] token ids, positions and slot mapping, block tables, lengths) "
              "and broadcasts it every step; only rank 0 samples. v1: a separate scheduler "
              "process publishes incremental diffs over the shared-memory ring, planning step t+1 "
              "while step t runs; every rank samples.\n")
    md.append("Times in ms. *Forward* is GPU time by CUDA events on the cuda backend (host time on "
              "the cpu backend). *GPU idle* on the cuda backend is measured by CUDA events: from "
              "the previous step's last operation to this step's first (v0: rank 0, so it includes "
              "the batch broadcast); on the cpu backend it is iteration time minus forward time. "
              "v1 workers are pipelined (step t+1 is launched while step t runs; "
              "`--pipeline=false` turns that off).\n")
    for tp in tps:
        md.append(f"\n## TP = {tp}\n")
        md.append("### v0: rank 0's scheduling overhead\n")
        md.append("| Batch | Schedule (ms) | Build batch (ms) | Broadcast (ms) | Forward (ms) | "
                  "Iteration (ms) | GPU idle (ms) | Overhead % |")
        md.append("|---|---|---|---|---|---|---|---|")
        for b in batches:
            s = data.get(("v0", tp, b))
            if not s:
                continue
            p = phases(s)
            it = p["iteration"]
            md.append(f"| {b} | {fmt(p['schedule'])} | {fmt(p['encode'])} | {fmt(p['publish'])} | "
                      f"{fmt(p['forward'])} | {fmt(it)} | {fmt(p['idle'])} | "
                      f"{100 * p['idle'] / it if it else 0:.1f}% |")
        md.append("\n### v1: per-iteration phases (worker side: max over ranks)\n")
        md.append("| Batch | Schedule (ms) | Encode (ms) | Publish (ms) | Apply (ms) | Build inputs (ms) "
                  "| Forward (ms) | Sample (ms) | Iteration (ms) | GPU idle (ms) | Iteration / forward |")
        md.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for b in batches:
            s = data.get(("v1", tp, b))
            if not s:
                continue
            p = phases(s)
            ratio = p["iteration"] / p["forward"] if p["forward"] else 0
            md.append(f"| {b} | {fmt(p['schedule'])} | {fmt(p['encode'])} | {fmt(p['publish'])} | "
                      f"{fmt(p['apply'])} | {fmt(p['build'])} | {fmt(p['forward'])} | "
                      f"{fmt(p['sample'])} | {fmt(p['iteration'])} | {fmt(p['idle'])} | "
                      f"{ratio:.3f} |")
        md.append("\n### End-to-end iteration time: v0 vs v1\n")
        md.append("| Batch | v0 Iteration (ms) | v1 Iteration (ms) | Speedup | Throughput Gain |")
        md.append("|---|---|---|---|---|")
        for b in batches:
            s0, s1 = data.get(("v0", tp, b)), data.get(("v1", tp, b))
            if not (s0 and s1):
                continue
            i0, i1 = phases(s0)["iteration"], phases(s1)["iteration"]
            sp = i0 / i1 if i1 else 0
            md.append(f"| {b} | {fmt(i0)} | {fmt(i1)} | {sp:.2f}x | {100 * (sp - 1):+.1f}% |")
        md.append("\n### Per-iteration scheduler-to-worker communication\n")
        md.append("| Batch | v0 broadcast | v1 diff | Reduction |")
        md.append("|---|---|---|---|")
        for b in batches:
            s0, s1 = data.get(("v0", tp, b)), data.get(("v1", tp, b))
            if not (s0 and s1):
                continue
            b0, b1 = phases(s0)["bytes"], phases(s1)["bytes"]
            md.append(f"| {b} | {human_bytes(b0)} | {human_bytes(b1)} | "
                      f"{(b0 / b1 if b1 else 0):.0f}x |")
    # Where v1 does not win.
    losses = []
    for (mode, tp, b), s in data.items():
        if mode != "v1" or ("v0", tp, b) not in data:
            continue
        i0, i1 = phases(data[("v0", tp, b)])["iteration"], phases(s)["iteration"]
        if i1 >= i0:
            losses.append(f"TP={tp} batch={b}: v1 {fmt(i1)} ms vs v0 {fmt(i0)} ms")
    md.append("\n## Where v1 does not win\n")
    md.append("\n".join(f"- {l}" for l in losses) if losses else
              "- v1's iteration time is below v0's in every measured cell.")
    md.append("")
    pngs = []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(tps), figsize=(5 * len(tps), 4), squeeze=False)
        for ax, tp in zip(axes[0], tps):
            for mode, style in (("v0", "o-"), ("v1", "s-")):
                xs = [b for b in batches if (mode, tp, b) in data]
                ax.plot(xs, [phases(data[(mode, tp, b)])["iteration"] for b in xs], style, label=mode)
            xs = [b for b in batches if ("v1", tp, b) in data]
            ax.plot(xs, [phases(data[("v1", tp, b)])["forward"] for b in xs], ":", label="forward (v1)")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch")
            ax.set_ylabel("iteration (ms)")
            ax.set_title(f"TP={tp}")
            ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "iteration_vs_batch.png"), dpi=110)
        pngs.append("iteration_vs_batch.png")
        keys = ["schedule", "encode", "publish", "apply", "build", "forward", "sample"]
        labels = {"encode": "encode / build batch", "publish": "publish / broadcast"}
        fig, axes = plt.subplots(1, len(tps), figsize=(6 * len(tps), 4), squeeze=False)
        for ax, tp in zip(axes[0], tps):
            names, bottoms = [], []
            rows = [(m, b) for b in batches for m in ("v0", "v1") if (m, tp, b) in data]
            names = [f"{m}\nB={b}" for m, b in rows]
            bottom = [0.0] * len(rows)
            for k in keys:
                vals = [phases(data[(m, tp, b)])[k] for m, b in rows]
                ax.bar(range(len(rows)), vals, bottom=bottom, label=labels.get(k, k))
                bottom = [x + y for x, y in zip(bottom, vals)]
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels(names, fontsize=7)
            ax.set_ylabel("ms per iteration (p50 phases)")
            ax.set_title(f"Phase breakdown, TP={tp}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, "phase_breakdown.png"), dpi=110)
        pngs.append("phase_breakdown.png")
    except ImportError:
        md.append("\n(matplotlib is not installed here: no plots.)\n")
    for p in pngs:
        md.append(f"![{p}]({p})\n")
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "report.json"), "w") as f:
        json.dump({f"{m}_tp{t}_b{b}": phases(s) for (m, t, b), s in sorted(data.items())}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
