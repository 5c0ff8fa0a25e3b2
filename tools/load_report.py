#!/usr/bin/env python3
"""v0 and v1 under load: load.md and load.json from the runs of tools/load_sweep.sh.

Each run directory is <mode>_r<rate> and holds the job's summary.json (docs/OUTPUTS.md).
Rows: per offered rate and mode, what the job measured (throughput, TTFT / TPOT / E2E
percentiles, GPU idle before each step). Then v1 against v0 at each rate. --check exits 1
when a run is missing its summary, leaves a request unfinished, or a rate lacks a mode.
"""
import argparse
import datetime
import json
import os
import platform
import re
import sys

from report import machine_label

RUN_DIR = re.compile(r"^(v[01])_r([0-9.]+)$")


def pct(s, key, p):
    d = s.get(key)
    return None if d is None else d.get(p)


def row(mode, rate, s):
    st = s.get("steps") or {}
    idle = st.get("gpu_idle_us")
    return {
        "mode": mode, "offered_rate": rate,
        "requests": s["requests"], "finished": s["finished_requests"],
        "wall_s": s["wall_s"],
        "request_throughput": s["request_throughput"],
        "output_tokens_per_s": s["output_tokens_per_s"],
        "ttft_p50_ms": pct(s, "ttft_ms", "p50"), "ttft_p90_ms": pct(s, "ttft_ms", "p90"),
        "ttft_p99_ms": pct(s, "ttft_ms", "p99"),
        "tpot_p50_ms": pct(s, "tpot_ms", "p50"), "tpot_p99_ms": pct(s, "tpot_ms", "p99"),
        "e2e_p50_ms": pct(s, "e2e_ms", "p50"), "e2e_p99_ms": pct(s, "e2e_ms", "p99"),
        "gpu_idle_p50_us": None if idle is None else idle["p50"],
        "steps": st.get("total"),
    }


def load(runs_dir):
    rows, problems, first = [], [], None
    for name in sorted(os.listdir(runs_dir)):
        m = RUN_DIR.match(name)
        if not m or not os.path.isdir(os.path.join(runs_dir, name)):
            continue
        mode, rate = m.group(1), float(m.group(2))
        path = os.path.join(runs_dir, name, "summary.json")
        if not os.path.exists(path):
            problems.append(f"{name}: no summary.json (the run failed)")
            continue
        with open(path) as f:
            s = json.load(f)
        first = first or s
        r = row(mode, rate, s)
        if r["finished"] != r["requests"]:
            problems.append(f"{name}: {r['finished']} of {r['requests']} requests finished")
        rows.append(r)
    # Offered rate ascending, the closed loop (0) last; v0 before v1.
    rows.sort(key=lambda r: (r["offered_rate"] == 0, r["offered_rate"], r["mode"]))
    return rows, problems, first


def rate_label(rate):
    return "closed loop" if rate == 0 else f"{rate:g}"


def f(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="?")
    ap.add_argument("--overrides", default="")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if a run failed, left a request unfinished or a rate lacks a mode")
    a = ap.parse_args()
    rows, problems, first = load(a.runs)
    if not rows:
        print("load_report.py: no runs found", file=sys.stderr)
        return 1
    by_rate = {}
    for r in rows:
        by_rate.setdefault(r["offered_rate"], {})[r["mode"]] = r
    modes = sorted({r["mode"] for r in rows})
    for rate, m in by_rate.items():
        for mode in modes:
            if mode not in m:
                problems.append(f"rate {rate_label(rate)}: no {mode} run")
    comparisons = []
    for rate, m in by_rate.items():
        if "v0" in m and "v1" in m:
            v0, v1 = m["v0"], m["v1"]
            comparisons.append({
                "offered_rate": rate,
                "output_throughput_v1_over_v0": ratio(v1["output_tokens_per_s"], v0["output_tokens_per_s"]),
                "tpot_p50_v1_over_v0": ratio(v1["tpot_p50_ms"], v0["tpot_p50_ms"]),
                "ttft_p99_v1_over_v0": ratio(v1["ttft_p99_ms"], v0["ttft_p99_ms"]),
                "e2e_p50_v1_over_v0": ratio(v1["e2e_p50_ms"], v0["e2e_p50_ms"]),
            })
    machine = machine_label(first, "")
    model = a.model + (f" ({a.overrides})" if a.overrides else "")
    flags = first.get("flags") or {}
    workload = {k: flags.get(k) for k in ("num-requests", "prompt-len", "output-len", "max-batch",
                                          "max-batched-tokens", "prefill-chunk", "seed")}
    md = ["# v0 and v1 under load\n",
          f"Generated {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')} UTC on "
          f"`{platform.node()}` ({machine}); backend **{first['backend']}**, TP {first['tp']}; model "
          f"**{model}**; commit `{first.get('commit', 'unknown')}`.\n",
          "The same seeded workload in every run (" +
          ", ".join(f"`--{k}={v}`" for k, v in workload.items() if v is not None) +
          "): requests arrive as a Poisson process at the offered rate (closed loop: `--max-batch` "
          "requests in flight, a new one as one finishes). Times in ms, percentiles over the "
          "requests; TPOT excludes the first token. *GPU idle* is the median device idle before "
          "a step, by CUDA events (v0: rank 0, so it includes the batch broadcast).\n",
          "| offered (req/s) | mode | finished | req/s | output tok/s | TTFT p50 | TTFT p99 | "
          "TPOT p50 | TPOT p99 | E2E p50 | E2E p99 | GPU idle p50 (us) |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {rate_label(r['offered_rate'])} | {r['mode']} | {r['finished']}/{r['requests']} | "
                  f"{f(r['request_throughput'])} | {f(r['output_tokens_per_s'], 0)} | "
                  f"{f(r['ttft_p50_ms'])} | {f(r['ttft_p99_ms'])} | {f(r['tpot_p50_ms'], 3)} | "
                  f"{f(r['tpot_p99_ms'], 3)} | {f(r['e2e_p50_ms'], 1)} | {f(r['e2e_p99_ms'], 1)} | "
                  f"{f(r['gpu_idle_p50_us'], 1)} |")
    if comparisons:
        md += ["\n## v1 against v0 at each rate (below 1 is better for time, above 1 for throughput)\n",
               "| offered (req/s) | output tok/s v1 / v0 | TPOT p50 v1 / v0 | TTFT p99 v1 / v0 | E2E p50 v1 / v0 |",
               "|---|---|---|---|---|"]
        for c in comparisons:
            md.append(f"| {rate_label(c['offered_rate'])} | {f(c['output_throughput_v1_over_v0'], 3)} | "
                      f"{f(c['tpot_p50_v1_over_v0'], 3)} | {f(c['ttft_p99_v1_over_v0'], 3)} | "
                      f"{f(c['e2e_p50_v1_over_v0'], 3)} |")
    if problems:
        md += ["\n## Problems\n"] + [f"- {p}" for p in problems]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "load.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
    with open(os.path.join(a.out, "load.json"), "w") as fh:
        json.dump({"model": model, "machine": machine, "backend": first["backend"], "tp": first["tp"],
                   "commit": first.get("commit"), "workload": workload, "rows": rows,
                   "v1_over_v0": comparisons, "problems": problems}, fh, indent=1)
    print(f"load: {os.path.join(a.out, 'load.md')}", file=sys.stderr)
    for p in problems:
        print(f"load: {p}", file=sys.stderr)
    return 1 if a.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
