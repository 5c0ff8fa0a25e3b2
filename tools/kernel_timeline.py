#!/usr/bin/env python3
"""Reads the in-graph kernel timeline of a SYMTP_KERNEL_TRACE build
(common/kernel_trace.h: one record per block, %globaltimer at entry, first
grid-dependency wait and exit) and says where a decode step's time goes on
its critical path.

  kernel_timeline.py TRACE.rank0.bin [--steps N] [--layer L] [--json OUT]
  kernel_timeline.py --self-test

A launch's blocks are its kind's records in entry order, `grid` at a time
(launches of one kind never overlap: a kernel between them waits for the
first). Launches are ordered by their first entry; launch i's "exposed" time
is its last exit minus launch i-1's last exit, so the exposed times of a
step sum to its span. Kernels that record nothing (cuBLASLt's GEMMs, NCCL's
kernels) fall into the exposed time of the next launch that records.
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
         17: "SampleShardCandidates", 18: "SampleFromCandidates"}
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


def self_test():
    """Three steps of a known chain (Embedding, then Gemv -> RopeKv -> Gemv):
    each launch's blocks wait 1 us after the previous launch's last exit and
    run 2 us (Gemv 5 us); the table must say so."""
    import os
    import tempfile
    recs = []
    t = 10_000
    for _ in range(4):
        for kind, grid, run in ((13, 2, 2000), (1, 3, 5000), (9, 1, 2000), (1, 3, 5000)):
            for b in range(grid):  # entered 500 ns early, waited until 1 us after the end
                recs.append((kind, b, b, grid, t - 500 + 10 * b, t + 1000, t + 1000 + run - 10 * b))
            t += 1000 + run
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
    for st in steps:
        kinds = [l["kind"] for l in st]
        assert kinds == ["Embedding", "Gemv", "RopeKv", "Gemv"], kinds
        for prev, cur in zip(st, st[1:]):
            run = 5000 if cur["kind"] == "Gemv" else 2000
            assert cur["last_exit"] - prev["last_exit"] == 1000 + run, (prev, cur)
            assert cur["last_wait"] - prev["last_exit"] == 1000
            assert prev["last_exit"] - cur["first_entry"] == 500
    print("kernel_timeline self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=5, help="last N complete steps")
    ap.add_argument("--layer", type=int, default=8, help="layer to list launch by launch")
    ap.add_argument("--json", default="")
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
    # Per kind: exposed time (critical path) and own span (first entry to last exit).
    exp = defaultdict(float)
    span = defaultdict(float)
    cnt = defaultdict(int)
    early = defaultdict(float)  # how long before the previous launch's end its first block entered
    wait = defaultdict(float)  # from the previous launch's last exit to this one's last wait
    nwait = defaultdict(int)
    spans = []
    for st in steps:
        spans.append(us(st[-1]["last_exit"] - st[0]["first_entry"]))
        for prev, cur in zip(st, st[1:]):
            exp[cur["kind"]] += us(cur["last_exit"] - prev["last_exit"])
            span[cur["kind"]] += us(cur["last_exit"] - cur["first_entry"])
            early[cur["kind"]] += us(prev["last_exit"] - cur["first_entry"])
            cnt[cur["kind"]] += 1
            if cur["last_wait"]:
                wait[cur["kind"]] += us(cur["last_wait"] - prev["last_exit"])
                nwait[cur["kind"]] += 1
    n = len(steps)
    res = resolution(recs)
    print(f"trace {a.trace}: {len(recs)} records, {len(ls)} launches, {n} steps used; "
          f"globaltimer resolution {res} ns" + ("; the ring wrapped" if wrapped else ""))
    print(f"step span (first entry to last exit): median {sorted(spans)[n // 2]:.1f} us")
    print()
    print("| kernel | launches / step | exposed / step (us) | exposed / launch (us) | "
          "own span / launch (us) | entered before the previous ended (us) | "
          "wait released after the previous ended (us) |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for k in sorted(exp, key=lambda k: -exp[k]):
        c = cnt[k]
        w = wait[k] / nwait[k] if nwait[k] else None
        row = dict(kernel=k, launches_per_step=c / n, exposed_us_per_step=exp[k] / n,
                   exposed_us_per_launch=exp[k] / c, span_us_per_launch=span[k] / c,
                   early_us_per_launch=early[k] / c, wait_release_us=w)
        rows.append(row)
        ws = f"{w:.2f}" if w is not None else "-"
        print(f"| {k} | {c / n:.0f} | {exp[k] / n:.1f} | {exp[k] / c:.2f} | {span[k] / c:.2f} | "
              f"{early[k] / c:.2f} | {ws} |")
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
                           step_span_us=sorted(spans)[n // 2], kinds=rows, layer=layer_rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
