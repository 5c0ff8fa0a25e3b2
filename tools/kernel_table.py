#!/usr/bin/env python3
"""Table of where one decode step's time goes (made by tools/kernel_table.sh).

For each batch: one step's kernels cut out of the Nsight Compute window (from
one EmbeddingKernel to the next, first profiled process), grouped by kernel
(template arguments dropped), with time per step, DRAM bytes and the fraction
of the copy bandwidth measured in the same run; then the step's graph-replay
time, the gaps (step without all-reduces minus the kernels' sum), the
all-reduce cost (step with minus without) and the floor: the weights and KV
cache one rank must read once, at the copy bandwidth.
Writes kernel_table.md and kernel_table.json into --dir.
"""
import argparse
import csv
import json
import os
import re
import sys

PRESETS = {  # hidden, layers, heads, kv_heads, ffn, vocab (models/config.cc)
    "llama-8b-shape": (4096, 32, 32, 8, 14336, 128256),
    "llama-70b-shape": (8192, 80, 64, 8, 28672, 128256),
}


def must_read_bytes(model, overrides, tp, batch, context):
    h, layers, heads, kvh, ffn, vocab = PRESETS[model]
    for item in filter(None, overrides.split(",")):
        k, v = item.split("=")
        if k == "layers":
            layers = int(v)
    d = h // heads
    per_layer = h * (heads + 2 * kvh) * d + heads * d * h + h * 2 * ffn + ffn * h
    weights = 2 * (layers * per_layer + h * vocab) / tp
    kv = 2 * 2 * batch * context * layers * kvh * d / tp
    return weights, kv


def shard_overrides(model, overrides, tp):
    """Overrides that make a TP=1 model with one TP=tp rank's kernel shapes."""
    h, layers, heads, kvh, ffn, vocab = PRESETS[model]
    own = dict(item.split("=") for item in filter(None, overrides.split(",")))
    heads, kvh = int(own.get("heads", heads)), int(own.get("kv_heads", kvh))
    d = int(own.get("head_dim", int(own.get("hidden", h)) // heads))
    own.update(heads=heads // tp, kv_heads=kvh // tp, head_dim=d,
               ffn=int(own.get("ffn", ffn)) // tp, vocab=int(own.get("vocab", vocab)) // tp)
    return ",".join(f"{k}={v}" for k, v in own.items())


def short_name(name):
    name = re.sub(r"^(void )?", "", name)
    name = re.sub(r"\(.*$", "", name)
    base = name.split("<")[0].split("::")[-1]
    if base.startswith("sm90_xmma") or base.startswith("nvjet") or "gemm" in base.lower():
        return "GEMM (cuBLASLt)"
    return base


def read_ncu(path):
    """Rows of the first profiled process, in launch order."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        return []
    head, data = rows[0], rows[2:]  # rows[1]: units (base units)
    col = {c: i for i, c in enumerate(head)}
    name_col = col.get("Kernel Name", col.get("Function Name"))
    pid_col = col["Process ID"]
    num = lambda s: float(s.replace(",", "")) if s not in ("", "n/a") else 0.0
    out = []
    first_pid = data[0][pid_col] if data else None
    for r in data:
        if r[pid_col] != first_pid:
            continue
        out.append({
            "name": r[name_col],
            "ns": num(r[col["gpu__time_duration.sum"]]),
            "bytes": num(r[col["dram__bytes_read.sum"]]) + num(r[col["dram__bytes_write.sum"]]),
        })
    return out


def one_step(kernels):
    marks = [i for i, k in enumerate(kernels) if short_name(k["name"]) == "EmbeddingKernel"]
    if len(marks) < 2:
        return None
    return kernels[marks[0]:marks[1]]


def step_us(run_dir):
    """Median decode forward time (us) of a run's summary.json."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    v = (json.load(open(path))["steps"].get("decode_forward_us") or {}).get("p50")
    return float(v) if v else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--model", default="llama-8b-shape")
    ap.add_argument("--overrides", default="layers=32")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batches", default="1 8 32 64")
    ap.add_argument("--dir")
    ap.add_argument("--print-shard-overrides", action="store_true")
    a = ap.parse_args()
    if a.print_shard_overrides:
        print(shard_overrides(a.model, a.overrides, a.tp))
        return 0
    bw = json.load(open(os.path.join(a.dir, "copy_bandwidth.json")))["bytes_per_s"]
    md = [f"# Decode step by kernel: {a.model} ({a.overrides}), TP={a.tp}, context {a.context}",
          "", f"Copy bandwidth measured in this run: {bw / 1e12:.2f} TB/s (read + write).", ""]
    result = {"tp": a.tp, "model": a.model, "overrides": a.overrides, "context": a.context,
              "copy_bandwidth_bytes_per_s": bw, "batches": []}
    for b in a.batches.split():
        b = int(b)
        ks = one_step(read_ncu(os.path.join(a.dir, f"b{b}.ncu.csv")) if os.path.exists(
            os.path.join(a.dir, f"b{b}.ncu.csv")) else [])
        t_ar = step_us(os.path.join(a.dir, f"b{b}.ar"))
        t_noar = step_us(os.path.join(a.dir, f"b{b}.noar")) if a.tp > 1 else t_ar
        weights, kv = must_read_bytes(a.model, a.overrides, a.tp, b, a.context)
        floor_us = (weights + kv) / bw * 1e6
        md += [f"## Batch {b}", ""]
        entry = {"batch": b, "step_us": t_ar, "step_no_allreduce_us": t_noar,
                 "floor_us": floor_us, "weights_bytes": weights, "kv_bytes": kv, "kernels": []}
        if not ks:
            md += ["(no complete step in the Nsight Compute window)", ""]
            result["batches"].append(entry)
            continue
        groups = {}
        for k in ks:
            g = groups.setdefault(short_name(k["name"]), {"n": 0, "ns": 0.0, "bytes": 0.0})
            g["n"] += 1
            g["ns"] += k["ns"]
            g["bytes"] += k["bytes"]
        total_ns = sum(g["ns"] for g in groups.values())
        md += ["| kernel | launches | time (us) | share | DRAM bytes (MB) | of copy BW |",
               "|---|---|---|---|---|---|"]
        for name, g in sorted(groups.items(), key=lambda kv_: -kv_[1]["ns"]):
            frac = g["bytes"] / (g["ns"] * 1e-9) / bw if g["ns"] else 0
            md.append(f"| {name} | {g['n']} | {g['ns'] / 1e3:.1f} | {g['ns'] / total_ns:.1%} | "
                      f"{g['bytes'] / 1e6:.1f} | {frac:.0%} |")
            entry["kernels"].append({"name": name, "launches": g["n"], "us": g["ns"] / 1e3,
                                     "dram_bytes": g["bytes"], "copy_bw_fraction": frac})
        kern_us = total_ns / 1e3
        entry["kernels_us"] = kern_us
        md.append(f"| **sum of kernels** | {len(ks)} | {kern_us:.1f} | | "
                  f"{sum(g['bytes'] for g in groups.values()) / 1e6:.1f} | |")
        md.append("")
        lines = [f"- floor (weights {weights / 1e9:.2f} GB + KV {kv / 1e9:.2f} GB at the copy "
                 f"bandwidth): {floor_us:.0f} us"]
        if t_noar is not None:
            lines.append(f"- step without all-reduces (graph replay, median): {t_noar:.0f} us; gaps "
                         f"(that minus the kernels): {t_noar - kern_us:.0f} us")
        if t_ar is not None and a.tp > 1 and t_noar is not None:
            lines.append(f"- step (graph replay, median): {t_ar:.0f} us; all-reduces "
                         f"(step minus step without them): {t_ar - t_noar:.0f} us")
        if t_ar is not None:
            lines.append(f"- step / floor: {t_ar / floor_us:.2f}x")
        md += lines + [""]
        result["batches"].append(entry)
    open(os.path.join(a.dir, "kernel_table.md"), "w").write("\n".join(md))
    json.dump(result, open(os.path.join(a.dir, "kernel_table.json"), "w"), indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
