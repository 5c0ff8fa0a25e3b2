#!/usr/bin/env python3
"""Table of where one decode step's time goes (made by tools/device/kernel_table.sh).

For each TP and batch: the kernels of one decode step (Nsight Compute over
kernels_bench's model section: one profiled step per batch, split at each
EmbeddingKernel), grouped by kernel (template arguments dropped; cuBLASLt's
kernels as one GEMM row), with time, DRAM bytes and the fraction of the copy
bandwidth measured in the same run; then the step's graph-replay time from
symtp, the gaps (step without all-reduces minus the kernels' sum), the
all-reduce cost (step with minus without them) and the floor: the weights and
KV cache one rank must read once, at the copy bandwidth (and, where
tools/device/read_bandwidth.sh wrote read_bandwidth.json in the same call, the
read floor: the same bytes at the read-only stream's best rate, and the weight
GEMMs by size beside the probe's rate at each size). The floor's KV is
that of symtp's median step (summary.json's steps.context: its sequences
attend over more than the 1024 keys it starts from, having decoded during the
batch's chunked prefill and the warm-up), and the profiled step attends over
the same keys (--print-keys gives them to kernels_bench's --model-contexts).
Writes kernel_table.md and kernel_table.json into --dir.
"""
import argparse
import csv
import json
import math
import os
import re
import sys

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 4096, 32, 8, 14336, 128256  # llama-8b-shape
CONTEXT = 1024


def shard_overrides(tp):
    """Overrides that give a TP=1 llama-8b-shape model one TP rank's shapes."""
    if tp == 1:
        return ""
    return (f"heads={HEADS // tp},kv_heads={KV_HEADS // tp},head_dim={HIDDEN // HEADS},"
            f"ffn={FFN // tp},vocab={VOCAB // tp}")


def must_read_bytes(tp, batch, layers, keys):
    """Weights and KV-cache bytes one rank reads once for a decode step whose
    sequences attend over `keys` keys each."""
    d = HIDDEN // HEADS
    per_layer = HIDDEN * (HEADS + 2 * KV_HEADS) * d + HEADS * d * HIDDEN + 3 * HIDDEN * FFN
    weights = 2 * (layers * per_layer + HIDDEN * VOCAB) / tp
    kv = 2 * 2 * batch * keys * layers * KV_HEADS * d / tp
    return weights, kv


def short_name(name):
    name = re.sub(r"\(.*$", "", re.sub(r"^void ", "", name)).replace("<unnamed>::", "")
    name = name.replace("(anonymous namespace)::", "")
    base = name.split("<")[0].split("::")[-1]
    low = base.lower()
    if low.startswith("nvjet") or "gemm" in low or "xmma" in low or "cutlass" in low:
        return "GEMM (cuBLASLt)"
    return base


def read_ncu(path):
    """Profiled launches in order: name, ns, DRAM bytes (ncu's long CSV)."""
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    launches = {}
    for r in csv.DictReader(lines):
        k = launches.setdefault(int(r["ID"]), {"name": r["Kernel Name"], "ns": 0.0, "bytes": 0.0})
        v = float(r["Metric Value"].replace(",", "") or 0)
        if r["Metric Name"] == "gpu__time_duration.sum":
            k["ns"] = v
        elif r["Metric Name"].startswith("dram__bytes"):
            k["bytes"] += v
    return [launches[i] for i in sorted(launches)]


def steps(launches):
    """Launches split into steps at each EmbeddingKernel."""
    out = []
    for k in launches:
        if short_name(k["name"]) == "EmbeddingKernel" or not out:
            # A pipelined step starts with the kernel that forwards the
            # previous step's sampled tokens.
            carry = [out[-1].pop()] if out and out[-1] and short_name(
                out[-1][-1]["name"]) == "ForwardTokensKernel" else []
            out.append(carry)
        out[-1].append(k)
    return [s for s in out if s]


def probe_rates(rb):
    """The read probe's best rate (bytes/s) at each per-launch size (MiB; back
    to back, launch gaps included), and its whole-buffer best at 2 GiB."""
    per = {}
    for k, v in rb.get("per_launch", {}).items():
        m = re.match(r"mb(\d+)_(.*)$", k)
        if m and not m.group(2).endswith("_dot"):
            per[int(m.group(1))] = max(per.get(int(m.group(1)), 0.0), v * 1e12)
    whole = [v for k, v in rb.get("whole_2gib", {}).items() if k.startswith("read_")]
    if whole:
        per[2048] = max(whole) * 1e12
    return sorted(per.items())


def probe_at(rates, mib):
    """The probe's rate at `mib`, log-linear between its sizes; None outside."""
    for (m0, r0), (m1, r1) in zip(rates, rates[1:]):
        if m0 <= mib <= m1:
            t = math.log(mib / m0) / math.log(m1 / m0)
            return r0 + t * (r1 - r0)
    return None


def weight_gemms(ks):
    """A step's GEMV / cuBLASLt launches clustered by DRAM bytes (within 5%):
    kernel, launches, median bytes and median duration (ns) of each cluster."""
    out = []
    for name in ("GemvKernel", "GEMM (cuBLASLt)"):
        ls = sorted((k for k in ks if short_name(k["name"]) == name and k["bytes"] > 0),
                    key=lambda k: k["bytes"])
        clusters = []
        for k in ls:
            if clusters and k["bytes"] <= 1.05 * clusters[-1][0]["bytes"]:
                clusters[-1].append(k)
            else:
                clusters.append([k])
        for c in clusters:
            med = lambda key: sorted(k[key] for k in c)[len(c) // 2]
            out.append({"name": name, "launches": len(c), "bytes": med("bytes"), "ns": med("ns")})
    return sorted(out, key=lambda g: -g["bytes"] * g["launches"])


def run_dir(d, tp, batch, skip_allreduce):
    """The symtp run kernel_table.sh made for this TP, batch and arm."""
    return os.path.join(d, f"tp{tp}.b{batch}.skip{'true' if skip_allreduce else 'false'}")


def step_medians(path):
    """A symtp run's median decode forward time (us) and median context (keys
    a sequence attends over) from its summary.json; None where absent."""
    p = os.path.join(path, "summary.json")
    if not os.path.exists(p):
        return None, None
    st = json.load(open(p))["steps"]
    med = lambda k: float((st.get(k) or {}).get("p50") or 0) or None
    return med("decode_forward_us"), med("context")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir")
    ap.add_argument("--tps", default="1 2")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--print-shard-overrides", action="store_true")
    ap.add_argument("--print-keys", action="store_true",
                    help="the keys of symtp's median step for each of --batches at --tp, "
                         "rounded, comma separated (1024 where a run is missing)")
    a = ap.parse_args()
    if a.print_shard_overrides:
        print(shard_overrides(a.tp))
        return 0
    batches = [int(b) for b in a.batches.split(",")]
    if a.print_keys:
        keys = [step_medians(run_dir(a.dir, a.tp, b, False))[1] for b in batches]
        print(",".join(str(round(k or CONTEXT)) for k in keys))
        return 0
    bw = json.load(open(os.path.join(a.dir, "copy_bandwidth.json")))["bytes_per_s"]
    # The read-only stream of tools/device/read_bandwidth.sh, where it ran:
    # its best whole-buffer rate, a stricter floor beside the copy's.
    rb = os.path.join(a.dir, "read_bandwidth.json")
    probe = probe_rates(json.load(open(rb))) if os.path.exists(rb) else []
    read_bw = dict(probe).get(2048)
    md = [f"# Decode step by kernel: llama-8b-shape, {a.layers} layers, context {CONTEXT} "
          "and what was decoded since, bf16, CUDA graphs", "",
          f"Copy bandwidth measured in this run: {bw / 1e12:.2f} TB/s (read + write)"
          + (f"; read-only stream {read_bw / 1e12:.2f} TB/s" if read_bw else "")
          + ". At TP > 1 the "
          "kernels are one rank's (a TP = 1 model with that rank's shapes; the LM-head all-gather "
          "and vocabulary assembly are not among them).", ""]
    result = {"model": "llama-8b-shape", "layers": a.layers, "context": CONTEXT,
              "copy_bandwidth_bytes_per_s": bw, "read_bandwidth_bytes_per_s": read_bw, "cases": []}
    summary = ["| TP | batch | keys | step (us) | kernels (us) | gaps (us) | all-reduces (us) "
               "| floor (us) | step / floor |" + (" read floor (us) | step / read floor |" if read_bw else ""),
               "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if read_bw else "")]
    for tp in [int(t) for t in a.tps.split()]:
        path = os.path.join(a.dir, f"tp{tp}.ncu.csv")
        all_steps = steps(read_ncu(path)) if os.path.exists(path) else []
        for i, b in enumerate(batches):
            ks = all_steps[i] if i < len(all_steps) else []
            t_ar, keys = step_medians(run_dir(a.dir, tp, b, False))
            t_noar = step_medians(run_dir(a.dir, tp, b, True))[0] if tp > 1 else t_ar
            keys = keys or CONTEXT
            weights, kv = must_read_bytes(tp, b, a.layers, keys)
            floor_us = (weights + kv) / bw * 1e6
            read_floor_us = (weights + kv) / read_bw * 1e6 if read_bw else None
            case = {"tp": tp, "batch": b, "keys": keys, "step_us": t_ar, "step_no_allreduce_us": t_noar,
                    "floor_us": floor_us, "read_floor_us": read_floor_us, "weights_bytes": weights,
                    "kv_bytes": kv, "kernels": []}
            md += [f"## TP={tp}, batch {b}", ""]
            groups = {}
            for k in ks:
                g = groups.setdefault(short_name(k["name"]), {"n": 0, "ns": 0.0, "bytes": 0.0})
                g["n"] += 1
                g["ns"] += k["ns"]
                g["bytes"] += k["bytes"]
            kern_us = sum(g["ns"] for g in groups.values()) / 1e3
            if groups:
                md += ["| kernel | launches | time (us) | share | DRAM (MB) | of copy BW |",
                       "|---|---|---|---|---|---|"]
                for name, g in sorted(groups.items(), key=lambda x: -x[1]["ns"]):
                    frac = g["bytes"] / (g["ns"] * 1e-9) / bw if g["ns"] else 0.0
                    md.append(f"| {name} | {g['n']} | {g['ns'] / 1e3:.1f} | "
                              f"{g['ns'] / 1e3 / kern_us:.1%} | {g['bytes'] / 1e6:.1f} | {frac:.0%} |")
                    case["kernels"].append({"name": name, "launches": g["n"], "us": g["ns"] / 1e3,
                                            "dram_bytes": g["bytes"], "copy_bw_fraction": frac})
                md += [f"| **all kernels** | {len(ks)} | {kern_us:.1f} | | "
                       f"{sum(g['bytes'] for g in groups.values()) / 1e6:.1f} | |", ""]
                wg = weight_gemms(ks)
                if wg:
                    md += ["Weight GEMMs by size (launches within 5% of the same DRAM bytes; medians). "
                           "The read probe's rate at that size"
                           + (" (`read_bandwidth.sh`, back-to-back launches, their gaps included)"
                              if probe else ": not measured in this run") + ":", "",
                           "| kernel | MiB a launch | launches | us a launch | TB/s | probe TB/s | of probe |",
                           "|---|---|---|---|---|---|---|"]
                    case["weight_gemms"] = []
                    for g in wg:
                        rate = g["bytes"] / (g["ns"] * 1e-9) if g["ns"] else 0.0
                        p = probe_at(probe, g["bytes"] / 2**20)
                        md.append(f"| {g['name']} | {g['bytes'] / 2**20:.1f} | {g['launches']} | "
                                  f"{g['ns'] / 1e3:.1f} | {rate / 1e12:.2f} | "
                                  + (f"{p / 1e12:.2f} | {rate / p:.0%} |" if p else "- | - |"))
                        case["weight_gemms"].append({"name": g["name"], "launches": g["launches"],
                                                     "dram_bytes": g["bytes"], "us": g["ns"] / 1e3,
                                                     "bytes_per_s": rate, "probe_bytes_per_s": p})
                    md.append("")
            else:
                md += ["(no profiled step)", ""]
            case["kernels_us"] = kern_us if groups else None
            gaps = t_noar - kern_us if t_noar and groups else None
            ar = t_ar - t_noar if t_ar and t_noar and tp > 1 else None
            fmt = lambda v: f"{v:.0f}" if v is not None else "-"
            summary.append(f"| {tp} | {b} | {keys:.0f} | {fmt(t_ar)} | {fmt(kern_us if groups else None)} | "
                           f"{fmt(gaps)} | {fmt(ar)} | {floor_us:.0f} | "
                           f"{(t_ar / floor_us) if t_ar else float('nan'):.2f}x |"
                           + (f" {read_floor_us:.0f} | {(t_ar / read_floor_us) if t_ar else float('nan'):.2f}x |"
                              if read_floor_us else ""))
            result["cases"].append(case)
    md[4:4] = ["## Summary", "",
               "Step: symtp's median decode forward time (graph replay). Gaps: the step without "
               "all-reduces minus the sum of its kernels' own durations. "
               "Keys: what a sequence attends over at symtp's median step, and in the profiled "
               "step. Floor: weights + KV cache (at those keys) of one rank read once at the "
               "copy bandwidth" + ("; read floor: the same bytes at the read-only stream's rate"
                                   if read_bw else "") + ".", ""] + summary + [""]
    open(os.path.join(a.dir, "kernel_table.md"), "w").write("\n".join(md) + "\n")
    json.dump(result, open(os.path.join(a.dir, "kernel_table.json"), "w"), indent=1)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
