#!/usr/bin/env python3
"""Reads the in-graph kernel timeline of a SYMTP_KERNEL_TRACE build
(common/kernel_trace.h: one record per block, %globaltimer at entry, first
grid-dependency wait and exit) and says where a decode step's time goes on
its critical path.

  kernel_timeline.py TRACE.rank0.bin [--steps N] [--layer L] [--json OUT]
  kernel_timeline.py --compare-ranks RANK0.json RANK1.json ...
  kernel_timeline.py --self-test

A launch's blocks are its kind's records in entry order, `grid` at a time
(launches of one kind never overlap: a kernel between them waits for the
first). Launches are ordered by their first entry; launch i's "exposed" time
is its last exit minus launch i-1's last exit, so the exposed times of a
step sum to its span. Kernels that record nothing (cuBLASLt's GEMMs, NCCL's
kernels) fall into the exposed time of the next launch that records. The
per-kind table gives each figure's median over the steps used, so that one
stalled step does not stand for the others. --compare-ranks puts the ranks'
tables (their --json files) side by side: each kernel's own span per launch
on every rank, and how far apart the ranks are (a rank that arrives late at
a collective shows as longer spans of that collective on the others).
"""
import argparse
import json
import struct
import sys
from collections import defaultdict

KINDS = {1: "Gemv", 2: "FusedNormLL", 3: "FusedNormLL128", 4: "FusedNormStaged",
         5: "AllReduceLL", 6: "AllReduceLL128", 7: "AllReduceStaged", 8: "AddRmsNorm",
         9: "RopeKv", 10: "DecodeAttention", 11: "MergeSplits", 12: "SiluMul",
         13: "Embedding", 14: "GatherRows", 15: "ForwardTokens", 16: "Sample",
         17: "SampleShardCandidates", 18: "SampleFromCandidates", 19: "AllReduceTwoShot",
         20: "FusedNormCopy"}
REC = struct.Struct("<IIIIQQQ")


def load(path):
    """The records, and whether the ring dropped the oldest (the file's
    header holds the records written and the ring's capacity)."""
    with open(path, "rb") as f:
        written, cap, n = struct.unpack("<QQQ", f.read(24))
        data = f.read(n * REC.size)
    recs = [REC.unpack_from(data, i * REC.size) for i in range(n)]
    recs = [dict(kind=r[0], block=r[1], smid=r[2], grid=r[3], t_entry=r[4], t_wait=r[5],
                 t_exit=r[6]) for r in recs]
    if written > cap:
        # The oldest launches may be partial: start at the first step begun after them.
        emb = [r["t_entry"] for r in recs if KINDS.get(r["kind"]) == "Embedding"]
        if emb:
            first = min(emb)
            recs = [r for r in recs if r["t_entry"] >= first]
    return recs, written > cap


def launches(recs):
    by_kind = defaultdict(list)
    for r in recs:
        by_kind[r["kind"]].append(r)
    out = []
    for kind, rs in by_kind.items():
        rs.sort(key=lambda r: r["t_entry"])
        i = 0
        while i < len(rs):
            g = max(1, rs[i]["grid"])
            blk = rs[i:i + g]
            i += g
            if len(blk) < g:
                break  # the ring's oldest records: a partial launch
            waits = [r["t_wait"] for r in blk if r["t_wait"]]
            out.append(dict(kind=KINDS.get(kind, str(kind)), grid=g,
                            first_entry=min(r["t_entry"] for r in blk),
                            last_entry=max(r["t_entry"] for r in blk),
                            last_wait=max(waits) if waits else None,
                            first_exit=min(r["t_exit"] for r in blk),
                            last_exit=max(r["t_exit"] for r in blk),
                            sms=len({r["smid"] for r in blk})))
    out.sort(key=lambda l: l["first_entry"])
    return out


def steps_of(ls):
    """Splits the launch list at each Embedding launch (a step's first)."""
    starts = [i for i, l in enumerate(ls) if l["kind"] == "Embedding"]
    return [ls[a:b] for a, b in zip(starts, starts[1:])]


def resolution(recs):
    ts = sorted({r["t_entry"] for r in recs} | {r["t_exit"] for r in recs})
    d = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    return min(d) if d else 0


def per_kind(steps):
    """Per kind: its launches a step and the median over the steps of its
    exposed time (critical path), own span (first entry to last exit), how
    long before the previous launch's end its first block entered, all
    summed over the step's launches (us), and of the mean release of its
    waits after the previous launch's end. Medians, so that one slow step
    (a stall on the host or on a peer) does not stand for all of them."""
    us = lambda ns: ns / 1000.0
    per_step = []
    for st in steps:
        d = defaultdict(lambda: dict(launches=0, exposed=0.0, span=0.0, early=0.0, waits=[]))
        for prev, cur in zip(st, st[1:]):
            e = d[cur["kind"]]
            e["launches"] += 1
            e["exposed"] += us(cur["last_exit"] - prev["last_exit"])
            e["span"] += us(cur["last_exit"] - cur["first_entry"])
            e["early"] += us(prev["last_exit"] - cur["first_entry"])
            if cur["last_wait"]:
                e["waits"].append(us(cur["last_wait"] - prev["last_exit"]))
        per_step.append(d)
    med = lambda v: sorted(v)[len(v) // 2]
    out = {}
    for k in {k for d in per_step for k in d}:
        ds = [d[k] for d in per_step if k in d]
        waits = [sum(d["waits"]) / len(d["waits"]) for d in ds if d["waits"]]
        out[k] = dict(launches=med([d["launches"] for d in ds]),
                      exposed=med([d["exposed"] for d in ds]), span=med([d["span"] for d in ds]),
                      early=med([d["early"] for d in ds]), wait=med(waits) if waits else None)
    return out


def compare_ranks(docs):
    """Markdown lines: per kernel (rank 0's order), its own span per launch on
    every rank and the spread (max - min); kernels missing on a rank show -."""
    spans = [{k["kernel"]: k["span_us_per_launch"] for k in d["kinds"]} for d in docs]
    lines = ["| kernel | " + " | ".join(f"rank {r} (us)" for r in range(len(docs))) + " | spread (us) |",
             "|---|" + "---|" * (len(docs) + 1)]
    for k in [x["kernel"] for x in docs[0]["kinds"]]:
        vals = [s.get(k) for s in spans]
        got = [v for v in vals if v is not None]
        cells = " | ".join("-" if v is None else f"{v:.2f}" for v in vals)
        lines.append(f"| {k} | {cells} | {max(got) - min(got):.2f} |")
    return lines


def self_test():
    """Three steps of a known chain (Embedding, then Gemv -> RopeKv -> Gemv):
    each launch's blocks wait 1 us after the previous launch's last exit and
    run 2 us (Gemv 5 us), except that the second step's RopeKv waits 100 us
    more (a stall); the per-step chain and the table's medians must say so."""
    import os
    import tempfile
    recs = []
    t = 10_000
    for step in range(4):
        for kind, grid, run in ((13, 2, 2000), (1, 3, 5000), (9, 1, 2000), (1, 3, 5000)):
            stall = 100_000 if step == 1 and kind == 9 else 0
            for b in range(grid):  # entered 500 ns early, waited until 1 us after the end
                recs.append((kind, b, b, grid, t - 500 + 10 * b, t + 1000 + stall,
                             t + 1000 + stall + run - 10 * b))
            t += 1000 + stall + run
    fd, path = tempfile.mkstemp(suffix=".bin")
    with os.fdopen(fd, "wb") as f:
        f.write(struct.pack("<QQQ", len(recs), 1 << 20, len(recs)))
        for r in recs:
            f.write(REC.pack(*r))
    try:
        got, wrapped = load(path)
        ls = launches(got)
    finally:
        os.unlink(path)
    assert not wrapped and len(ls) == 16, (wrapped, len(ls))
    steps = steps_of(ls)
    assert len(steps) == 3, len(steps)
    for i, st in enumerate(steps):
        kinds = [l["kind"] for l in st]
        assert kinds == ["Embedding", "Gemv", "RopeKv", "Gemv"], kinds
        for prev, cur in zip(st, st[1:]):
            run = 5000 if cur["kind"] == "Gemv" else 2000
            stall = 100_000 if i == 1 and cur["kind"] == "RopeKv" else 0
            assert cur["last_exit"] - prev["last_exit"] == 1000 + stall + run, (prev, cur)
            assert cur["last_wait"] - prev["last_exit"] == 1000 + stall
            assert prev["last_exit"] - cur["first_entry"] == 500
    table = per_kind(steps)  # medians over the steps: the stall does not show
    assert table["RopeKv"]["launches"] == 1 and table["Gemv"]["launches"] == 2, table
    assert abs(table["RopeKv"]["exposed"] - 3.0) < 1e-9, table["RopeKv"]
    assert abs(table["Gemv"]["exposed"] - 12.0) < 1e-9, table["Gemv"]
    assert abs(table["RopeKv"]["wait"] - 1.0) < 1e-9 and abs(table["Gemv"]["wait"] - 1.0) < 1e-9
    assert abs(table["RopeKv"]["early"] - 0.5) < 1e-9, table["RopeKv"]
    docs = [dict(kinds=[dict(kernel="Gemv", span_us_per_launch=5.0),
                        dict(kernel="RopeKv", span_us_per_launch=2.0)]),
            dict(kinds=[dict(kernel="RopeKv", span_us_per_launch=2.5)])]
    got = compare_ranks(docs)
    assert got[2] == "| Gemv | 5.00 | - | 0.00 |" and got[3] == "| RopeKv | 2.00 | 2.50 | 0.50 |", got
    print("kernel_timeline self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    if sys.argv[1:2] == ["--compare-ranks"]:
        docs = []
        for path in sys.argv[2:]:
            with open(path) as f:
                docs.append(json.load(f))
        if not docs:
            sys.exit("kernel_timeline: --compare-ranks needs the ranks' --json files")
        print("\n".join(compare_ranks(docs)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=5, help="last N complete steps")
    ap.add_argument("--layer", type=int, default=8, help="layer to list launch by launch")
    ap.add_argument("--json", default="")
    ap.add_argument("--expect-step-us", type=float, default=0.0,
                    help="the recording job's median step; a step span of the steps used more "
                         "than 10%% away from it is reported (they are not the job's steady steps)")
    a = ap.parse_args()
    recs, wrapped = load(a.trace)
    ls = launches(recs)
    # The last N steps of the job's most common shape (launch count): a job's
    # prefill, its first eager steps and its shrinking last batches differ.
    all_steps = steps_of(ls)
    if not all_steps:
        sys.exit("kernel_timeline: no complete step in the trace")
    counts = defaultdict(int)
    for st in all_steps:
        counts[len(st)] += 1
    common = max(counts, key=lambda c: (counts[c], c))
    steps = [st for st in all_steps if len(st) == common][-a.steps:]
    us = lambda ns: ns / 1000.0
    table = per_kind(steps)
    spans = [us(st[-1]["last_exit"] - st[0]["first_entry"]) for st in steps]
    n = len(steps)
    res = resolution(recs)
    print(f"trace {a.trace}: {len(recs)} records, {len(ls)} launches, {n} steps used; "
          f"globaltimer resolution {res} ns" + ("; the ring wrapped" if wrapped else ""))
    span = sorted(spans)[n // 2]
    print(f"step span (first entry to last exit): median {span:.1f} us")
    steady = a.expect_step_us <= 0 or abs(span / a.expect_step_us - 1) <= 0.10
    if not steady:
        print(f"NOT THE STEADY STEPS: their span is {span / a.expect_step_us:.2f}x the job's median "
              f"step ({a.expect_step_us:.1f} us); the table below describes other steps")
    print()
    print("| kernel | launches / step | exposed / step (us) | exposed / launch (us) | "
          "own span / launch (us) | entered before the previous ended (us) | "
          "wait released after the previous ended (us) |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for k in sorted(table, key=lambda k: -table[k]["exposed"]):
        t = table[k]
        c = t["launches"]
        w = t["wait"]
        row = dict(kernel=k, launches_per_step=c, exposed_us_per_step=t["exposed"],
                   exposed_us_per_launch=t["exposed"] / c, span_us_per_launch=t["span"] / c,
                   early_us_per_launch=t["early"] / c, wait_release_us=w)
        rows.append(row)
        ws = f"{w:.2f}" if w is not None else "-"
        print(f"| {k} | {c} | {t['exposed']:.1f} | {t['exposed'] / c:.2f} | {t['span'] / c:.2f} | "
              f"{t['early'] / c:.2f} | {ws} |")
    # One layer launch by launch (the step of median span): times relative to
    # the previous launch's last exit.
    st = sorted(steps, key=lambda x: x[-1]["last_exit"] - x[0]["first_entry"])[n // 2]
    # A layer starts at its QKV GEMV (4 GEMVs a layer) or, where cuBLASLt runs
    # the GEMMs (nothing recorded), at its RoPE kernel (exposed the QKV GEMM's
    # time too).
    gemvs = [i for i, l in enumerate(st) if l["kind"] == "Gemv"]
    ropes = [i for i, l in enumerate(st) if l["kind"] == "RopeKv"]
    anchors = gemvs[::4] if len(gemvs) >= 4 * len(ropes) > 0 else ropes
    if len(anchors) > a.layer + 1:
        first, last = anchors[a.layer], anchors[a.layer + 1] - 1
    else:
        first, last = 1, min(len(st) - 1, 12)
    print()
    print(f"Layer {a.layer} of the median step (us relative to the previous launch's last exit):")
    print("| launch | grid | SMs | first entry | last entry | last wait | first exit | last exit |")
    print("|---|---|---|---|---|---|---|---|")
    layer_rows = []
    for prev, cur in zip(st[first - 1:last], st[first:last + 1]):
        z = prev["last_exit"]
        rel = lambda t: us(t - z) if t else float("nan")
        r = dict(kernel=cur["kind"], grid=cur["grid"], sms=cur["sms"],
                 first_entry=rel(cur["first_entry"]), last_entry=rel(cur["last_entry"]),
                 last_wait=rel(cur["last_wait"]), first_exit=rel(cur["first_exit"]),
                 last_exit=rel(cur["last_exit"]))
        layer_rows.append(r)
        print(f"| {r['kernel']} | {r['grid']} | {r['sms']} | {r['first_entry']:.2f} | "
              f"{r['last_entry']:.2f} | {r['last_wait']:.2f} | {r['first_exit']:.2f} | "
              f"{r['last_exit']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(trace=a.trace, steps=n, resolution_ns=res,
                           step_span_us=span, steady=steady, kinds=rows, layer=layer_rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
